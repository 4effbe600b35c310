//! Which sandboxes `provisioner sandboxes --pod NS/NAME --verdict V` (and `why`) are about.

use crate::pod::{Pod, PodName};
use crate::trace::Verdict;

use super::kernel_watch::views::{AbsentSandbox, SandboxView};

/// Keeps the sandboxes of one pod and/or with one latest verdict; the default keeps all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// `namespace/name`, or a bare name (see [`Pod::matches`]).
    pub pod: Option<String>,
    pub verdict: Option<Verdict>,
}

impl SandboxFilter {
    /// The filter of a request's `pod` and `verdict` (a verdict's name, as `provisioner
    /// sandboxes` prints it), or why the verdict names none.
    pub fn parse(pod: Option<String>, verdict: Option<&str>) -> Result<Self, String> {
        let verdict = verdict
            .map(|name| {
                Verdict::ALL
                    .into_iter()
                    .find(|v| v.as_str().eq_ignore_ascii_case(name))
                    .ok_or_else(|| {
                        let known: Vec<&str> = Verdict::ALL.iter().map(|v| v.as_str()).collect();
                        format!("no verdict {name:?} (one of {})", known.join(", "))
                    })
            })
            .transpose()?;
        Ok(Self { pod, verdict })
    }

    pub fn keeps(&self, view: &SandboxView) -> bool {
        let pod_ok = self.pod.as_deref().is_none_or(|query| {
            view.pod()
                .and_then(PodName::known)
                .is_some_and(|pod| pod.matches(query))
        });
        let verdict_ok = self
            .verdict
            .is_none_or(|want| view.verdict.as_ref().is_some_and(|v| v.verdict == want));
        pod_ok && verdict_ok
    }

    /// An absent sandbox has no verdict: only a filter without one keeps it.
    pub fn keeps_absent(&self, absent: &AbsentSandbox) -> bool {
        self.verdict.is_none()
            && self.pod.as_deref().is_none_or(|query| {
                absent
                    .pod
                    .as_ref()
                    .is_some_and(|pod: &Pod| pod.matches(query))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_is_named_as_sandboxes_prints_it_and_junk_is_refused() {
        let filter =
            SandboxFilter::parse(Some("default/web-0".into()), Some("SKIPPED")).expect("a verdict");
        assert_eq!(filter.verdict, Some(Verdict::Skipped));
        let err = SandboxFilter::parse(None, Some("broken")).expect_err("no such verdict");
        assert!(err.contains("networked, skipped"), "{err}");
        assert_eq!(
            SandboxFilter::parse(None, None).expect("none"),
            SandboxFilter::default()
        );
    }
}
