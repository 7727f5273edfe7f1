//! Panics anywhere in the process during a run, so that "bad input never panics" is
//! checked too: a panic in a controller task may be swallowed by its runtime.

use std::sync::{Arc, Mutex, PoisonError};

/// The panics seen since [`PanicLog::install`], oldest first, as `thread: message`.
#[derive(Clone, Debug, Default)]
pub struct PanicLog(Arc<Mutex<Vec<String>>>);

impl PanicLog {
    /// Installs a process-wide panic hook that records every panic, then calls the hook
    /// that was there before. For binaries and test functions; call it once.
    #[must_use]
    pub fn install() -> Self {
        let log = Self::default();
        let recorder = log.clone();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("unnamed").to_owned();
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(ToString::to_string)
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            recorder.lock().push(format!("{name}: {message}{at}"));
            previous(info);
        }));
        log
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many panics so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none so far.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The panics after the first `from`.
    #[must_use]
    pub fn since(&self, from: usize) -> Vec<String> {
        self.lock().iter().skip(from).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_on_any_thread_is_recorded_with_the_thread_name() {
        let log = PanicLog::install();
        let before = log.len();
        let joined = std::thread::Builder::new()
            .name("replica-s5-0.1".to_owned())
            .spawn(|| panic!("bad input"))
            .unwrap()
            .join();
        assert!(joined.is_err());
        let seen = log.since(before);
        assert!(
            seen.iter()
                .any(|p| p.starts_with("replica-s5-0.1: bad input at ")),
            "{seen:?}"
        );
    }
}
