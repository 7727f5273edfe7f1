//! A tokeniser for the git-config style INI syntax that gcfg (and so vsphere-csi-driver)
//! reads: `[section]`, `[section "subsection"]`, `name = value`, a bare `name` meaning
//! `true`, `;` and `#` comments, double quotes with `\"` `\\` `\n` `\t` `\b` escapes, and a
//! trailing backslash continuing a value on the next line. Every item keeps its line number.

/// One meaningful line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Item {
    /// `[name]` or `[name "sub"]`; `name` is lower-cased (gcfg is case-insensitive there).
    Section {
        line: usize,
        name: String,
        display: String,
        sub: Option<String>,
    },
    /// `name = value`; `name` lower-cased; `value` is `None` for a bare `name`.
    Variable {
        line: usize,
        name: String,
        value: Option<String>,
    },
}

/// A syntax error at `line`, in `section` (as written, `VirtualCenter "vc1"`) and at `key`
/// when known. The message never quotes the line: it may hold a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SyntaxError {
    pub(super) line: usize,
    pub(super) section: Option<String>,
    pub(super) key: Option<String>,
    pub(super) message: String,
}

fn err(line: usize, message: impl Into<String>) -> SyntaxError {
    SyntaxError {
        line,
        section: None,
        key: None,
        message: message.into(),
    }
}

impl SyntaxError {
    fn at(mut self, section: Option<&str>, key: Option<&str>) -> Self {
        self.section = section.map(str::to_owned);
        self.key = key.map(str::to_owned);
        self
    }
}

/// Splits `text` into sections and variables.
pub(super) fn tokenize(text: &str) -> Result<Vec<Item>, SyntaxError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut items = Vec::new();
    let mut index = 0;
    let mut current: Option<String> = None;
    while index < lines.len() {
        let line_no = index + 1;
        let line = lines[index].trim_start_matches('\u{feff}').trim();
        index += 1;
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let item = section(line_no, rest)?;
            if let Item::Section { display, sub, .. } = &item {
                current = Some(match sub {
                    Some(sub) => format!("{display} {sub:?}"),
                    None => display.clone(),
                });
            }
            items.push(item);
            continue;
        }
        let name_end = line
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(line.len());
        let (name, rest) = line.split_at(name_end);
        let section = current.as_deref();
        if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(err(line_no, "expected name = value").at(section, None));
        }
        let rest = rest.trim_start();
        let value = if rest.is_empty() || rest.starts_with(';') || rest.starts_with('#') {
            None
        } else if let Some(raw) = rest.strip_prefix('=') {
            let value = value(line_no, raw, &lines, &mut index);
            Some(value.map_err(|e| e.at(section, Some(name)))?)
        } else {
            return Err(err(line_no, "expected name = value").at(section, Some(name)));
        };
        items.push(Item::Variable {
            line: line_no,
            name: name.to_ascii_lowercase(),
            value,
        });
    }
    Ok(items)
}

fn section(line_no: usize, rest: &str) -> Result<Item, SyntaxError> {
    let name_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
        .unwrap_or(rest.len());
    let name = &rest[..name_end];
    if name.is_empty() {
        return Err(err(line_no, "section header has no name"));
    }
    let mut chars = rest[name_end..].trim_start().chars();
    let mut sub = None;
    let mut next = chars.next();
    if next == Some('"') {
        let mut text = String::new();
        loop {
            match chars.next() {
                None => {
                    return Err(err(
                        line_no,
                        format!("unterminated quote in section [{name} ..."),
                    ));
                }
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some(c @ ('"' | '\\')) => text.push(c),
                    _ => return Err(err(line_no, "invalid escape in section name")),
                },
                Some(c) => text.push(c),
            }
        }
        sub = Some(text);
        next = chars.by_ref().find(|c| !c.is_whitespace());
    }
    if next != Some(']') {
        return Err(err(
            line_no,
            format!("section header [{name} is not closed with ]"),
        ));
    }
    let trailing: String = chars.collect();
    let trailing = trailing.trim();
    if !(trailing.is_empty() || trailing.starts_with(';') || trailing.starts_with('#')) {
        return Err(err(line_no, "unexpected text after the section header"));
    }
    Ok(Item::Section {
        line: line_no,
        name: name.to_ascii_lowercase(),
        display: name.to_owned(),
        sub,
    })
}

/// Reads a value starting at `raw`, following backslash continuations into `lines`.
fn value(
    line_no: usize,
    raw: &str,
    lines: &[&str],
    index: &mut usize,
) -> Result<String, SyntaxError> {
    let mut out = String::new();
    let mut pending_space = String::new();
    let mut quoted = false;
    let mut current = raw.trim_start().to_owned();
    loop {
        let mut chars = current.chars().peekable();
        let mut continued = false;
        while let Some(c) = chars.next() {
            match c {
                '"' => {
                    out.push_str(&std::mem::take(&mut pending_space));
                    quoted = !quoted;
                }
                '\\' => match chars.next() {
                    None => {
                        continued = true;
                        break;
                    }
                    Some(e) => {
                        out.push_str(&std::mem::take(&mut pending_space));
                        out.push(match e {
                            '\\' => '\\',
                            '"' => '"',
                            'n' => '\n',
                            't' => '\t',
                            'b' => '\u{8}',
                            // Never quote the character: it is part of the value.
                            _ => {
                                return Err(err(
                                    line_no,
                                    "invalid escape in value (a backslash may only precede \\, \", n, t or b)",
                                ));
                            }
                        });
                    }
                },
                ';' | '#' if !quoted => break,
                c if c.is_whitespace() && !quoted => pending_space.push(c),
                c => {
                    out.push_str(&std::mem::take(&mut pending_space));
                    out.push(c);
                }
            }
        }
        if !continued {
            break;
        }
        let Some(next) = lines.get(*index) else {
            return Err(err(line_no, "value continues past the end of the file"));
        };
        *index += 1;
        current = (*next).to_owned();
    }
    if quoted {
        return Err(err(line_no, "unterminated quote in value"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(line: usize, name: &str, value: Option<&str>) -> Item {
        Item::Variable {
            line,
            name: name.into(),
            value: value.map(str::to_owned),
        }
    }

    #[test]
    fn values_quotes_comments_and_continuations() {
        let text = "[Global]\n a = 1 ; comment\n b = \"x ; y\" # c\n c = two  words  \n d\n e = \"q\\\"\\\\\"\n f = a\\\n b\n";
        let items = tokenize(text).unwrap();
        assert_eq!(
            items[0],
            Item::Section {
                line: 1,
                name: "global".into(),
                display: "Global".into(),
                sub: None
            }
        );
        assert_eq!(items[1], var(2, "a", Some("1")));
        assert_eq!(items[2], var(3, "b", Some("x ; y")));
        assert_eq!(items[3], var(4, "c", Some("two  words")));
        assert_eq!(items[4], var(5, "d", None));
        assert_eq!(items[5], var(6, "e", Some("q\"\\")));
        assert_eq!(items[6], var(7, "f", Some("a b")));
    }

    #[test]
    fn subsections_keep_case_and_escapes() {
        let items = tokenize("[VirtualCenter \"VC.example\\\"1\"]\n").unwrap();
        assert_eq!(
            items[0],
            Item::Section {
                line: 1,
                name: "virtualcenter".into(),
                display: "VirtualCenter".into(),
                sub: Some("VC.example\"1".into()),
            }
        );
    }

    #[test]
    fn syntax_errors_carry_their_line() {
        for (text, line, needle) in [
            ("[Global]\nuser = \"abc\n", 2, "unterminated quote"),
            ("\n[VirtualCenter \"vc\n", 2, "unterminated quote"),
            ("[Global\n", 1, "not closed"),
            ("[Global]\n= x\n", 2, "expected name = value"),
            ("[Global]\nuser: x\n", 2, "expected name = value"),
            ("[Global]\na = \\q\n", 2, "invalid escape"),
            ("[Global]\na = x\\", 2, "past the end"),
            ("[]\n", 1, "no name"),
        ] {
            let e = tokenize(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e:?}");
            assert!(e.message.contains(needle), "{text:?}: {e:?}");
        }
    }

    #[test]
    fn syntax_errors_name_section_and_key_but_never_quote_the_line() {
        for (text, section, key) in [
            (
                "[Global]\npassword = \"hunter2\n",
                Some("Global"),
                Some("password"),
            ),
            (
                "[VirtualCenter \"vc1\"]\npassword: hunter2\n",
                Some("VirtualCenter \"vc1\""),
                Some("password"),
            ),
            ("[Global]\n= hunter2\n", Some("Global"), None),
            ("password hunter2\n", None, Some("password")),
        ] {
            let e = tokenize(text).unwrap_err();
            assert_eq!(e.section.as_deref(), section, "{text:?}: {e:?}");
            assert_eq!(e.key.as_deref(), key, "{text:?}: {e:?}");
            assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
        }
    }
}
