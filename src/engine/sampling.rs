//! Choosing the next token from logits (greedy, temperature, top-k, top-p, seeded) with
//! logprobs, and matching `stop` strings in streamed text.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Everything that decides how one request's tokens are chosen and when it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Seed for a reproducible draw; `None` draws a fresh seed.
    pub seed: Option<u64>,
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// Stop tokens are suppressed until this many tokens were generated (vLLM extension).
    pub min_tokens: usize,
    /// Keep generating through stop tokens (vLLM extension; benchmarks need exact lengths).
    pub ignore_eos: bool,
    /// Number of top alternatives to report per token; `None` reports no logprobs.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            ignore_eos: false,
            logprobs: None,
        }
    }
}

/// One chosen token with its log-probability under the model's raw distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Its logprob; `None` unless logprobs were requested (the normalisation over the whole
    /// vocabulary is skipped otherwise, as it costs host time on every token).
    pub logprob: Option<f32>,
    /// The most likely tokens with their logprobs, best first (empty unless requested).
    pub top: Vec<(u32, f32)>,
}

/// A per-request sampler; its random stream depends only on the request's seed.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler for `params`.
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        Sampler {
            params,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Choose the next token. `banned` tokens are never chosen (stop tokens before
    /// `min_tokens`); logprobs are reported from the unmodified logits, as vLLM does.
    pub fn sample(&mut self, logits: &[f32], banned: &[u32]) -> Sampled {
        let allowed = |i: usize| !banned.contains(&(i as u32)) && !logits[i].is_nan();
        let greedy = self.params.temperature <= 1e-5 || self.params.top_k == 1;
        let token = if greedy {
            argmax(logits, allowed)
        } else {
            self.draw(logits, allowed)
        };
        let Some(n) = self.params.logprobs else {
            return Sampled {
                token: token as u32,
                logprob: None,
                top: Vec::new(),
            };
        };
        let lse = log_sum_exp(logits);
        let top = top_n(logits, n)
            .into_iter()
            .map(|i| (i as u32, logits[i] - lse))
            .collect();
        Sampled {
            token: token as u32,
            logprob: Some(logits[token] - lse),
            top,
        }
    }

    fn draw(&mut self, logits: &[f32], allowed: impl Fn(usize) -> bool) -> usize {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let mut cand: Vec<(usize, f32)> = (0..logits.len())
            .filter(|&i| allowed(i))
            .map(|i| (i, logits[i] * inv_t))
            .collect();
        if cand.is_empty() {
            return argmax(logits, |_| true);
        }
        let by_logit_desc =
            |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            cand.truncate(p.top_k);
        }
        if p.top_p < 1.0 || p.top_k > 0 {
            // A fixed order makes the draw depend only on the seed.
            cand.sort_unstable_by(by_logit_desc);
        }
        let m = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let mut w: Vec<f64> = cand.iter().map(|c| f64::from(c.1 - m).exp()).collect();
        let total: f64 = w.iter().sum();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = w
                .iter()
                .position(|x| {
                    acc += x / total;
                    acc >= f64::from(p.top_p)
                })
                .map_or(w.len(), |i| i + 1);
            w.truncate(keep);
        }
        let total: f64 = w.iter().sum();
        let mut u = self.rng.random::<f64>() * total;
        for (c, x) in cand.iter().zip(&w) {
            if u < *x {
                return c.0;
            }
            u -= x;
        }
        cand[w.len() - 1].0
    }
}

fn log_sum_exp(logits: &[f32]) -> f32 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return m;
    }
    let s: f64 = logits.iter().map(|&l| f64::from(l - m).exp()).sum();
    m + s.ln() as f32
}

/// The index of the largest allowed logit; ties go to the lower index.
fn argmax(logits: &[f32], allowed: impl Fn(usize) -> bool) -> usize {
    let mut best: Option<usize> = None;
    for i in (0..logits.len()).filter(|&i| allowed(i)) {
        if best.is_none_or(|b| logits[i] > logits[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0)
}

/// Indices of the `n` largest logits, best first.
fn top_n(logits: &[f32], n: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let cmp = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then_with(|| a.cmp(b));
    let n = n.min(idx.len());
    if n < idx.len() {
        idx.select_nth_unstable_by(n - 1, cmp);
        idx.truncate(n);
    }
    idx.sort_unstable_by(cmp);
    idx
}

/// Finds `stop` strings in streamed text. Text that could still be the start of a stop
/// string is held back, so a client never sees part of a stop string.
#[derive(Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
}

impl StopStrings {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Add text; returns the text safe to emit and whether a stop string was found (then
    /// the text is cut before it and nothing more should be emitted).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest tail that is a prefix of some stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (out, false)
    }

    /// End of generation without a stop string: release the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..50).map(|i| ((i * 7919) % 13) as f32 * 0.3).collect()
    }

    #[test]
    fn greedy_picks_argmax_and_reports_logprobs() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            logprobs: Some(3),
            ..Default::default()
        });
        let l = vec![0.0, 2.0, 1.0, 2.0];
        let out = s.sample(&l, &[]);
        assert_eq!(out.token, 1, "ties go to the lower index");
        let lse = (1.0f32 + 2.0f32.exp() * 2.0 + 1.0f32.exp()).ln();
        assert!((out.logprob.unwrap() - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(
            out.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 3, 2]
        );
        assert_eq!(s.sample(&l, &[1]).token, 3);
    }

    #[test]
    fn seed_reproduces_and_differs() {
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.5,
                seed: Some(seed),
                ..Default::default()
            });
            (0..40)
                .map(|_| s.sample(&logits(), &[]).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_and_top_p_restrict_choices() {
        let l = logits();
        let best: Vec<u32> = top_n(&l, 2).into_iter().map(|i| i as u32).collect();
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 2,
            seed: Some(1),
            ..Default::default()
        });
        for _ in 0..100 {
            assert!(best.contains(&s.sample(&l, &[]).token));
        }
        let peaked = vec![10.0, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: Some(1),
            ..Default::default()
        });
        for _ in 0..100 {
            assert_eq!(s.sample(&peaked, &[]).token, 0);
        }
    }

    #[test]
    fn banned_tokens_are_never_drawn() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed: Some(3),
            ..Default::default()
        });
        let l = vec![5.0, 0.0, 0.0];
        for _ in 0..50 {
            let out = s.sample(&l, &[0]);
            assert_ne!(out.token, 0);
            assert_eq!(out.logprob, None, "no logprobs unless requested");
        }
    }

    #[test]
    fn stop_strings_hold_back_and_cut() {
        let mut m = StopStrings::new(vec!["END".into(), "xyz".into()]);
        assert_eq!(m.push("hello E"), ("hello ".to_string(), false));
        assert_eq!(m.push("N"), (String::new(), false));
        assert_eq!(m.push("X more"), ("ENX more".to_string(), false));
        assert_eq!(m.push(" fine xy"), (" fine ".to_string(), false));
        assert_eq!(m.push("zz tail"), (String::new(), true));
        let mut m = StopStrings::new(vec!["EN".into()]);
        assert_eq!(m.push("ab E"), ("ab ".to_string(), false));
        assert_eq!(m.finish(), "E");
        let mut none = StopStrings::new(vec![]);
        assert_eq!(none.push("E"), ("E".to_string(), false));
    }
}
