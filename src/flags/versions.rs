//! Which upstream vLLM release knows which name: a stock image is rendered for the vLLM version
//! it carries, so a name upstream renamed (the attention backend's environment variable that
//! became `--attention-backend`) or added later (an MXFP4 MoE switch) is said the way that
//! release understands it, or refused before launch when that release cannot say it at all.
//!
//! The version comes from the image itself (`vllm --version` in a short-lived container of the
//! same image, before the real launch: `launch::dialect`); when it cannot be known the names are
//! rendered for [`NEWEST_KNOWN`] and the launch says so. Sources of every row are in
//! `docs/flags.md` ("vLLM versions").

use super::names::{self, VllmName};
use std::cmp::Ordering;
use std::fmt;

/// An upstream vLLM release, as `vllm --version` or the start-up banner prints it.
///
/// Only major, minor and patch take part in comparisons: `0.13.0rc1`, `0.13.0+cu130` and
/// `0.13.0.dev12+gabc` all count as 0.13.0 (a release candidate already carries the renames of
/// its release).
#[derive(Debug, Clone, Eq)]
pub struct VllmVersion {
    /// Major, minor, patch.
    pub release: (u32, u32, u32),
    /// The text as read, e.g. `0.11.1rc2.dev10+g1234abc`.
    pub raw: String,
}

impl VllmVersion {
    /// A release by number.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        VllmVersion {
            release: (major, minor, patch),
            raw: String::new(),
        }
    }

    /// Reads a version such as `0.11.0`, `v0.11.2`, `0.10.1.1` or `0.11.1rc2.dev10+gabc`;
    /// `None` when the text does not start with `MAJOR.MINOR`.
    pub fn parse(text: &str) -> Option<Self> {
        let t = text.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let mut nums = [0u32; 3];
        let mut rest = t;
        for (i, n) in nums.iter_mut().enumerate() {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if digits.is_empty() {
                // Major and minor are required; the patch may be missing (`0.11`).
                if i < 2 {
                    return None;
                }
                break;
            }
            *n = digits.parse().ok()?;
            rest = &rest[digits.len()..];
            match rest.strip_prefix('.') {
                Some(r) if i < 2 => rest = r,
                _ if i < 1 => return None,
                _ => break,
            }
        }
        let end = t.find(|c: char| c.is_whitespace()).unwrap_or(t.len());
        Some(VllmVersion {
            release: (nums[0], nums[1], nums[2]),
            raw: t[..end].to_string(),
        })
    }
}

impl PartialEq for VllmVersion {
    fn eq(&self, other: &Self) -> bool {
        self.release == other.release
    }
}

impl PartialOrd for VllmVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for VllmVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.release.cmp(&other.release)
    }
}

impl fmt::Display for VllmVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.raw.is_empty() {
            let (a, b, c) = self.release;
            write!(f, "{a}.{b}.{c}")
        } else {
            f.write_str(&self.raw)
        }
    }
}

/// The newest release whose names this table has been checked against. An image whose
/// version is unknown is rendered as this release; a newer one is rendered the same way with a
/// note, since later releases moved MoE selection towards `--moe-backend` (see `docs/flags.md`).
pub const NEWEST_KNOWN: VllmVersion = VllmVersion::new(0, 14, 0);

/// One name's history in upstream vLLM.
#[derive(Debug, Clone, Copy)]
pub struct NameHistory {
    /// The name as the newer releases know it.
    pub name: &'static VllmName,
    /// The first release that reads it.
    pub since: (u32, u32, u32),
    /// What releases before `since` read instead (same value), if anything.
    pub before: Option<&'static VllmName>,
    /// Where this is established (upstream PRs, release docs).
    pub source: &'static str,
}

/// Every name whose availability depends on the release. `VLLM_MXFP4_USE_MARLIN`'s row is a
/// lower bound: no MXFP4 MoE switch exists before gpt-oss support (0.10.1), and the release
/// that added this one is not established, so it is rendered from 0.10.1 on.
pub const HISTORY: &[NameHistory] = &[
    NameHistory {
        name: &names::ATTENTION_BACKEND,
        since: (0, 13, 0),
        before: Some(&names::VLLM_ATTENTION_BACKEND),
        source: "vllm-project/vllm#26315 added AttentionConfig with --attention-backend and deprecated VLLM_ATTENTION_BACKEND (warning: removal in v0.14.0 or v1.0.0); docs v0.13.0 have vllm/config/attention.py, v0.11.2's attention selector still reads envs.VLLM_ATTENTION_BACKEND; 0.26.0 no longer reads the variable at all (vllm-project/vllm#50292)",
    },
    NameHistory {
        name: &names::ATTENTION_CONFIG,
        since: (0, 13, 0),
        before: None,
        source: "vllm-project/vllm#26315 (the --attention-config group, same release as --attention-backend)",
    },
    NameHistory {
        name: &names::VLLM_USE_FLASHINFER_MOE_MXFP4_BF16,
        since: (0, 10, 1),
        before: None,
        source: "vllm-project/vllm#22339 ([gpt-oss] flashinfer mxfp4) in the gpt-oss release 0.10.1; vllm-project/vllm#23008 made it the SM100 default",
    },
    NameHistory {
        name: &names::VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8,
        since: (0, 10, 1),
        before: None,
        source: "vllm-project/vllm#22339, with VLLM_USE_FLASHINFER_MOE_MXFP4_BF16",
    },
    NameHistory {
        name: &names::VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS,
        since: (0, 10, 2),
        before: None,
        source: "vllm-project/vllm#23696 ([Kernel][B200] mxfp4 fused cutlass moe); docs v0.10.2 list Mxfp4Backend.SM100_FI_MXFP4_MXFP8_CUTLASS, v0.10.1's mxfp4 module has no backend enum",
    },
    NameHistory {
        name: &names::VLLM_MXFP4_USE_MARLIN,
        since: (0, 10, 1),
        before: None,
        source: "lower bound only: MXFP4 MoE (and Marlin's MXFP4 support, vllm-project/vllm#22428) arrived with gpt-oss in 0.10.1; the release that added this switch is not established here",
    },
];

/// What a release does with a name: read it, read an older name instead, or nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Availability {
    /// The release reads this name.
    Known,
    /// The release reads this older name instead.
    Older(&'static VllmName),
    /// The release has no way to say it; the first release that does.
    Missing((u32, u32, u32)),
}

/// How release `v` says `name`.
pub fn availability(name: &VllmName, v: &VllmVersion) -> Availability {
    match HISTORY.iter().find(|h| h.name.name == name.name) {
        None => Availability::Known,
        Some(h) if v.release >= h.since => Availability::Known,
        Some(h) => match h.before {
            Some(old) => Availability::Older(old),
            None => Availability::Missing(h.since),
        },
    }
}

/// Whether releases `a` and `b` say every name of [`HISTORY`] the same way (so a launch
/// rendered for one is right for the other).
pub fn same_names(a: &VllmVersion, b: &VllmVersion) -> bool {
    HISTORY
        .iter()
        .all(|h| availability(h.name, a) == availability(h.name, b))
}

/// The vLLM version a stock image is rendered for, and how it was known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageVersion {
    /// The version.
    pub version: VllmVersion,
    /// How it was learnt, e.g. `vllm --version`.
    pub source: String,
}

/// `major.minor.patch` for messages.
pub fn release_str(r: (u32, u32, u32)) -> String {
    format!("{}.{}.{}", r.0, r.1, r.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_the_way_vllm_prints_them() {
        for (text, want, raw) in [
            ("0.11.0", (0, 11, 0), "0.11.0"),
            ("v0.11.2\n", (0, 11, 2), "0.11.2"),
            ("0.10.1.1", (0, 10, 1), "0.10.1.1"),
            (
                "0.11.1rc2.dev10+g1234abc",
                (0, 11, 1),
                "0.11.1rc2.dev10+g1234abc",
            ),
            ("0.13.0+cu130 extra", (0, 13, 0), "0.13.0+cu130"),
            ("0.14", (0, 14, 0), "0.14"),
        ] {
            let v = VllmVersion::parse(text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!((v.release, v.raw.as_str()), (want, raw), "{text}");
        }
        for bad in ["", "vllm", "11", "INFO 11-25 10:00:00 started", "x0.11.0"] {
            assert_eq!(VllmVersion::parse(bad), None, "{bad}");
        }
        assert!(VllmVersion::parse("0.13.0rc1").unwrap() == VllmVersion::new(0, 13, 0));
        assert!(VllmVersion::parse("0.9.2").unwrap() < VllmVersion::new(0, 10, 1));
        assert_eq!(VllmVersion::new(0, 14, 0).to_string(), "0.14.0");
    }

    #[test]
    fn names_follow_their_release() {
        let v = |s| VllmVersion::parse(s).unwrap();
        assert_eq!(
            availability(&names::ATTENTION_BACKEND, &v("0.12.0")),
            Availability::Older(&names::VLLM_ATTENTION_BACKEND)
        );
        assert_eq!(
            availability(&names::ATTENTION_BACKEND, &v("0.13.0")),
            Availability::Known
        );
        assert_eq!(
            availability(
                &names::VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS,
                &v("0.10.1")
            ),
            Availability::Missing((0, 10, 2))
        );
        assert_eq!(
            availability(&names::VLLM_MXFP4_USE_MARLIN, &v("0.10.1")),
            Availability::Known
        );
        assert_eq!(
            availability(&names::VLLM_MXFP4_USE_MARLIN, &v("0.9.2")),
            Availability::Missing((0, 10, 1))
        );
        assert_eq!(
            availability(&names::KV_CACHE_DTYPE, &v("0.9.0")),
            Availability::Known
        );
        assert!(same_names(&v("0.13.0"), &v("0.14.1")));
        assert!(same_names(&v("0.10.2"), &v("0.11.2")));
        assert!(!same_names(&v("0.12.0"), &v("0.13.0")));
        assert!(!same_names(&v("0.10.1"), &v("0.10.2")));
    }
}
