//! Statistics over raw samples: the one place mean, std and percentiles are computed, so
//! a record's summaries can always be recomputed from its raw per-request timings.

use super::schema::{Latency, LatencyStats, RequestTiming, Stats};

impl Stats {
    /// Mean, sample std (n − 1), min and max of the finite samples; `None` when there are none.
    pub fn from_samples(samples: &[f64]) -> Option<Stats> {
        let v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        let (mean, std) = mean_std(&v);
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Stats {
            n: v.len(),
            mean,
            std,
            min,
            max,
        })
    }

    /// Coefficient of variation in percent (std / mean · 100); `None` when the mean is 0.
    pub fn cv_pct(&self) -> Option<f64> {
        (self.mean != 0.0).then(|| self.std / self.mean.abs() * 100.0)
    }
}

impl LatencyStats {
    /// Mean, sample std and p50/p90/p99 of the finite samples; `None` when there are none.
    pub fn from_samples(samples: &[f64]) -> Option<LatencyStats> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let (mean, std) = mean_std(&v);
        Some(LatencyStats {
            n: v.len(),
            mean,
            std,
            p50: percentile_sorted(&v, 50.0),
            p90: percentile_sorted(&v, 90.0),
            p99: percentile_sorted(&v, 99.0),
        })
    }
}

/// Mean and sample standard deviation (n − 1 in the denominator; 0 for one sample).
fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Percentile `p` (0–100) of ascending `sorted` by linear interpolation between closest
/// ranks — numpy's default, which `vllm bench serve` uses, so figures match theirs.
/// Returns NaN for an empty slice.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

impl RequestTiming {
    /// Output tokens: `completion_tokens` when reported, else the tokens counted per chunk.
    pub fn output_tokens(&self) -> u32 {
        self.completion_tokens
            .unwrap_or_else(|| self.arrivals.iter().map(|a| a.1).sum())
    }

    /// Start → first token, ms; `None` for failed requests or when no token arrived.
    pub fn ttft_ms(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        self.first_token_ms
    }

    /// Start → end, ms; `None` for failed requests.
    pub fn e2el_ms(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        self.end_ms
    }

    /// (E2EL − TTFT) / (output tokens − 1), ms; `None` with fewer than two output tokens.
    pub fn tpot_ms(&self) -> Option<f64> {
        let out = self.output_tokens();
        if out < 2 {
            return None;
        }
        Some((self.e2el_ms()? - self.ttft_ms()?) / f64::from(out - 1))
    }

    /// Gaps between consecutive token-bearing chunks, ms (empty for failed requests).
    pub fn itl_ms(&self) -> Vec<f64> {
        if self.error.is_some() {
            return Vec::new();
        }
        self.arrivals.windows(2).map(|w| w[1].0 - w[0].0).collect()
    }
}

impl Latency {
    /// TTFT, TPOT, ITL and E2EL distributions over the measured (non-warm-up), successful
    /// requests.
    pub fn from_requests(requests: &[RequestTiming]) -> Latency {
        let measured: Vec<&RequestTiming> = requests.iter().filter(|r| !r.warmup).collect();
        let ttft: Vec<f64> = measured.iter().filter_map(|r| r.ttft_ms()).collect();
        let tpot: Vec<f64> = measured.iter().filter_map(|r| r.tpot_ms()).collect();
        let itl: Vec<f64> = measured.iter().flat_map(|r| r.itl_ms()).collect();
        let e2el: Vec<f64> = measured.iter().filter_map(|r| r.e2el_ms()).collect();
        Latency {
            ttft_ms: LatencyStats::from_samples(&ttft),
            tpot_ms: LatencyStats::from_samples(&tpot),
            itl_ms: LatencyStats::from_samples(&itl),
            e2el_ms: LatencyStats::from_samples(&e2el),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::schema::Arrival;

    #[test]
    fn stats_match_hand_computed_values() {
        let s = Stats::from_samples(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(s.n, 8);
        assert_eq!(s.mean, 5.0);
        // Sample variance = 32 / 7.
        assert!((s.std - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!((s.min, s.max), (2.0, 9.0));
        let one = Stats::from_samples(&[3.5]).unwrap();
        assert_eq!((one.n, one.mean, one.std), (1, 3.5, 0.0));
        assert!(Stats::from_samples(&[]).is_none());
        assert!(Stats::from_samples(&[f64::NAN]).is_none());
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        // numpy.percentile([1,2,3,4,5,6,7,8,9,10], [50, 90, 99]) = 5.5, 9.1, 9.91
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        let l = LatencyStats::from_samples(&v).unwrap();
        assert!((l.p50 - 5.5).abs() < 1e-12);
        assert!((l.p90 - 9.1).abs() < 1e-12);
        assert!((l.p99 - 9.91).abs() < 1e-12);
        assert_eq!(percentile_sorted(&[7.0], 99.0), 7.0);
        assert!(percentile_sorted(&[], 50.0).is_nan());
    }

    #[test]
    fn request_latencies_follow_vllm_definitions() {
        let r = RequestTiming {
            first_chunk_ms: Some(90.0),
            first_token_ms: Some(100.0),
            arrivals: vec![Arrival(100.0, 1), Arrival(120.0, 2), Arrival(150.0, 1)],
            end_ms: Some(160.0),
            completion_tokens: None,
            ..RequestTiming::default()
        };
        assert_eq!(r.output_tokens(), 4);
        assert_eq!(r.ttft_ms(), Some(100.0));
        assert_eq!(r.tpot_ms(), Some(20.0)); // (160 - 100) / 3
        assert_eq!(r.itl_ms(), vec![20.0, 30.0]);
        let failed = RequestTiming {
            error: Some("HTTP 500".into()),
            ..r.clone()
        };
        let warm = RequestTiming {
            warmup: true,
            end_ms: Some(999.0),
            ..r.clone()
        };
        let lat = Latency::from_requests(&[r, failed, warm]);
        let e2el = lat.e2el_ms.unwrap();
        assert_eq!((e2el.n, e2el.mean), (1, 160.0));
        assert_eq!(lat.itl_ms.unwrap().n, 2);
    }
}
