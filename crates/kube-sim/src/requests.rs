//! The request log tests assert on.

use std::collections::VecDeque;

/// One request the sim answered, as [`KubeSim::requests`](crate::KubeSim::requests) returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestRecord {
    /// Audit verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`; `discovery` for discovery documents and `other` for the rest.
    pub verb: String,
    /// The URL path, e.g. `/api/v1/namespaces/default/persistentvolumeclaims/a`.
    pub path: String,
    /// The raw query string without `?` (empty when none).
    pub query: String,
    /// The HTTP status code of the response (200 for a watch that started streaming).
    pub status: u16,
    /// The resource plural, e.g. `persistentvolumeclaims` (empty for non-resource paths).
    pub resource: String,
    /// The subresource, e.g. `status`.
    pub subresource: Option<String>,
    /// The object name from the path.
    pub name: Option<String>,
    /// The namespace from the path.
    pub namespace: Option<String>,
    /// The user of the request's bearer token when the sim minted it
    /// ([`KubeSim::service_account_config`](crate::KubeSim::service_account_config)), e.g.
    /// `system:serviceaccount:storage:provisioner`; `None` for the unrestricted clients.
    /// Set for resource requests.
    pub user: Option<String>,
}

/// A bounded log: the oldest records are dropped beyond `limit`.
#[derive(Debug)]
pub(crate) struct RequestLog {
    records: VecDeque<RequestRecord>,
    limit: usize,
}

impl RequestLog {
    /// A log keeping at most `limit` records.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            records: VecDeque::new(),
            limit,
        }
    }

    /// Appends a record.
    pub(crate) fn push(&mut self, record: RequestRecord) {
        if self.limit == 0 {
            return;
        }
        if self.records.len() >= self.limit {
            self.records.pop_front();
        }
        self.records.push_back(record);
    }

    /// A copy of every kept record, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<RequestRecord> {
        self.records.iter().cloned().collect()
    }

    /// Forgets every record.
    pub(crate) fn clear(&mut self) {
        self.records.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u16) -> RequestRecord {
        RequestRecord {
            verb: "get".into(),
            path: "/api".into(),
            query: String::new(),
            status: i,
            resource: String::new(),
            subresource: None,
            name: None,
            namespace: None,
            user: None,
        }
    }

    #[test]
    fn keeps_only_the_newest_records() {
        let mut log = RequestLog::new(2);
        for i in 0..3 {
            log.push(rec(i));
        }
        let kept: Vec<u16> = log.snapshot().iter().map(|r| r.status).collect();
        assert_eq!(kept, vec![1, 2]);
        log.clear();
        assert!(log.snapshot().is_empty());
    }
}
