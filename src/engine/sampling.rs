//! Choosing the next token from logits (penalties, greedy, temperature, top-k, top-p, seeded)
//! with logprobs, and matching `stop` strings in streamed text.

use super::structured::{Constraint, Grammar};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Everything that decides how one request's tokens are chosen and when it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Keep tokens at least this fraction as likely as the most likely one (after the
    /// temperature, before top-p, as vLLM's min-p); 0 disables it.
    pub min_p: f32,
    /// Seed for a reproducible draw; `None` draws a fresh seed.
    pub seed: Option<u64>,
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// Stop tokens are suppressed until this many tokens were generated (vLLM extension).
    pub min_tokens: usize,
    /// Keep generating through stop tokens (vLLM extension; benchmarks need exact lengths).
    pub ignore_eos: bool,
    /// This request's own stop tokens besides the model's (vLLM's `stop_token_ids`): they
    /// end generation even with `ignore_eos`, and are banned until `min_tokens`, as in vLLM.
    pub stop_token_ids: Vec<u32>,
    /// Number of top alternatives to report per token; `None` reports no logprobs.
    pub logprobs: Option<usize>,
    /// Subtracted once from the logit of every token already generated (0 disables it).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (0 disables it).
    pub frequency_penalty: f32,
    /// Divides positive and multiplies negative logits of tokens in prompt or output
    /// (1 disables it).
    pub repetition_penalty: f32,
    /// Added to the logits of these token ids before penalties and sampling (OpenAI's
    /// `logit_bias`); empty disables it.
    pub logit_bias: Vec<(u32, f32)>,
    /// Structured output: only tokens that keep the answer inside this grammar may be
    /// chosen (`response_format`); `None` leaves the choice free.
    pub grammar: Option<Arc<Grammar>>,
    /// Score the prompt: every prompt token after the first gets its raw logprob and the
    /// `logprobs` most likely alternatives (completions with `echo` and `logprobs`).
    pub prompt_logprobs: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            logprobs: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            grammar: None,
            prompt_logprobs: false,
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
///
/// The draw (see [`choose`]) is defined so that a backend can compute it without sorting the
/// vocabulary: every step that is not greedy takes exactly one uniform number from the
/// request's stream ([`Sampler::next_uniform`]), on the host, so a seed gives the same tokens
/// whether the host or the device turns that number into a token.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// The history the penalties read; `None` when every penalty is off, so plain requests
    /// pay nothing for them.
    history: Option<History>,
    /// This sequence's place in its grammar (structured output).
    constraint: Option<Constraint>,
}

/// The tokens a request has seen, as the penalties need them.
#[derive(Debug, Default)]
struct History {
    /// Token ids of the prompt (repetition penalty).
    prompt: HashSet<u32>,
    /// How often each token id was generated so far.
    output: HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler for `params` with no prompt: the repetition penalty sees only the output.
    pub fn new(params: SamplingParams) -> Self {
        Self::for_prompt(params, &[])
    }

    /// A sampler for `params` whose penalties also count `prompt` (as vLLM's repetition
    /// penalty does).
    pub fn for_prompt(params: SamplingParams, prompt: &[u32]) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        let history = params.has_penalties().then(|| History {
            prompt: prompt.iter().copied().collect(),
            output: HashMap::new(),
        });
        let constraint = params.grammar.as_deref().map(Grammar::start);
        Sampler {
            params,
            rng: StdRng::seed_from_u64(seed),
            history,
            constraint,
        }
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether every token is the argmax (no random number is drawn then).
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// The next number of the request's stream, uniform in [0, 1). Call it once per sampled
    /// token, and only when the sampler is not greedy, as [`Sampler::sample`] does.
    pub fn next_uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// Choose the next token. `banned` tokens are never chosen (stop tokens before
    /// `min_tokens`), unless a grammar allows nothing else; logprobs are reported from the
    /// unmodified logits, as vLLM does.
    pub fn sample(&mut self, logits: &[f32], banned: &[u32]) -> Sampled {
        let u = if self.is_greedy() {
            0.0
        } else {
            self.next_uniform()
        };
        let allowed = self.constraint.as_mut().and_then(Constraint::allowed);
        let token =
            if self.history.is_none() && self.params.logit_bias.is_empty() && allowed.is_none() {
                choose(logits, banned, &self.params, u)
            } else {
                let mut adjusted = logits.to_vec();
                let mut banned = banned;
                if let Some(a) = &allowed {
                    a.mask(&mut adjusted);
                    // The grammar wins over min_tokens: when it allows only stop tokens, the
                    // answer is complete.
                    if a.is_within(banned) {
                        banned = &[];
                    }
                }
                // vLLM's order: the bias, then the penalties.
                apply_logit_bias(&mut adjusted, &self.params.logit_bias);
                if let Some(h) = &self.history {
                    apply_penalties(&mut adjusted, &self.params, &h.prompt, &h.output);
                }
                choose(&adjusted, banned, &self.params, u)
            };
        if let Some(c) = &mut self.constraint {
            c.commit(token as u32);
        }
        if let Some(h) = &mut self.history {
            *h.output.entry(token as u32).or_insert(0) += 1;
        }
        if self.params.logprobs.is_none() {
            return Sampled {
                token: token as u32,
                logprob: None,
                top: Vec::new(),
            };
        }
        self.score(logits, token as u32)
    }
}

impl Sampler {
    /// `token` scored instead of chosen (a prompt token: [`SamplingParams::prompt_logprobs`]):
    /// its raw logprob under `logits` and the `logprobs` most likely tokens (what
    /// [`Self::sample`] reports for the token it chose). The random stream, the grammar and the
    /// penalties' history are left as they were.
    pub fn score(&self, logits: &[f32], token: u32) -> Sampled {
        let lse = log_sum_exp(logits);
        let top = top_n(logits, self.params.logprobs.unwrap_or(0))
            .into_iter()
            .map(|i| (i as u32, logits[i] - lse))
            .collect();
        Sampled {
            token,
            logprob: logits.get(token as usize).map(|&l| l - lse),
            top,
        }
    }
}

impl SamplingParams {
    /// Greedy: temperature at most 1e-5, or `top_k == 1`.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 1e-5 || self.top_k == 1
    }

    /// Whether any of presence, frequency or repetition penalty is on. Such rows need the
    /// request's token history, which only the host sampler keeps.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Whether this row's logits must be adjusted on the host before sampling (a penalty,
    /// which reads the token history only the host keeps, a logit bias, or a grammar, whose
    /// state only the host keeps). The CUDA backend downloads such rows and samples them with
    /// [`Sampler::sample`].
    pub fn needs_host_logits(&self) -> bool {
        self.has_penalties()
            || !self.logit_bias.is_empty()
            || self.grammar.is_some()
            || self.min_p > 0.0
    }
}

/// Add each `(token, bias)` to its logit (ids outside the vocabulary are ignored; the server
/// refuses them before they get here).
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(t, b) in bias {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += b;
        }
    }
}

/// Apply the penalties to `logits` in place, as vLLM defines them and in its order:
/// repetition first (every token id of `prompt` or `output`: a positive logit is divided by
/// `r`, a negative one multiplied by `r`), then frequency (`f` × the token's count in
/// `output` subtracted), then presence (`p` subtracted once per token id in `output`).
/// Penalties apply before temperature, top-k and top-p.
pub fn apply_penalties(
    logits: &mut [f32],
    p: &SamplingParams,
    prompt: &HashSet<u32>,
    output: &HashMap<u32, u32>,
) {
    let r = p.repetition_penalty;
    if r != 1.0 {
        // A token in both prompt and output is penalised once, as vLLM's mask does.
        let seen = prompt
            .iter()
            .chain(output.keys().filter(|t| !prompt.contains(t)));
        for &t in seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / r } else { *l * r };
            }
        }
    }
    for (&t, &n) in output {
        if let Some(l) = logits.get_mut(t as usize) {
            *l -= p.frequency_penalty * n as f32 + p.presence_penalty;
        }
    }
}

/// Weight of a scaled logit `z` relative to the largest one, `exp(z - zmax)`. When `zmax` is
/// infinite the tokens at `zmax` share all the weight (equally) and the rest get none.
pub fn weight(z: f32, zmax: f32) -> f64 {
    if zmax.is_infinite() {
        if z == zmax { 1.0 } else { 0.0 }
    } else {
        (f64::from(z) - f64::from(zmax)).exp()
    }
}

/// The kept set of a non-greedy draw, as the host computes it: tokens `i` that are allowed
/// (not banned, not NaN) with `z_i = logit_i / T >= threshold`.
struct KeptSet {
    /// Scaled logits of allowed tokens (`None` for banned or NaN ones).
    z: Vec<Option<f32>>,
    zmax: f32,
    threshold: f32,
    /// Nucleus decision margin: the smallest |mass above a value − top_p · mass| over the
    /// distinct kept values, relative to the mass (infinite without top-p).
    top_p_margin: f64,
}

fn kept_set(logits: &[f32], banned: &[u32], p: &SamplingParams) -> Option<KeptSet> {
    let t = p.temperature;
    let z: Vec<Option<f32>> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (!l.is_nan() && !banned.contains(&(i as u32))).then(|| l / t))
        .collect();
    let mut vals: Vec<f32> = z.iter().flatten().copied().collect();
    if vals.is_empty() {
        return None;
    }
    let zmax = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // top-k: keep z >= the k-th largest (ties at the boundary all stay).
    let mut threshold = f32::NEG_INFINITY;
    if p.top_k > 0 && p.top_k < vals.len() {
        let (_, kth, _) = vals.select_nth_unstable_by(p.top_k - 1, |a, b| b.total_cmp(a));
        threshold = *kth;
        vals.retain(|&v| v >= threshold);
    }
    // min-p: keep z >= zmax + ln(min_p), i.e. exp(z - zmax) >= min_p (with top-k, the larger
    // of the two thresholds; both only cut from below, so their order does not matter).
    if p.min_p > 0.0 {
        let floor = zmax + p.min_p.ln();
        if floor > threshold {
            threshold = floor;
            vals.retain(|&v| v >= threshold);
        }
    }
    // top-p: keep the values whose strictly-larger kept mass is below top_p of the kept mass.
    let mut top_p_margin = f64::INFINITY;
    if p.top_p < 1.0 {
        vals.sort_unstable_by(|a, b| b.total_cmp(a));
        let total: f64 = vals.iter().map(|&v| weight(v, zmax)).sum();
        let limit = f64::from(p.top_p) * total;
        let mut above = 0.0f64;
        let mut i = 0;
        let mut decided = false;
        while i < vals.len() {
            let v = vals[i];
            let mut group = 0.0;
            while i < vals.len() && vals[i] == v {
                group += weight(v, zmax);
                i += 1;
            }
            top_p_margin = top_p_margin.min((above - limit).abs() / total);
            if !decided {
                if above < limit || above == 0.0 {
                    // Values fall, and every one here already passed top-k.
                    threshold = v;
                } else {
                    decided = true;
                }
            }
            above += group;
        }
    }
    Some(KeptSet {
        z,
        zmax,
        threshold,
        top_p_margin,
    })
}

/// The token a request chooses from `logits`, given its uniform number `u` in [0, 1) (ignored
/// when greedy). The definition every backend implements:
///
/// * allowed tokens are those not in `banned` whose logit is not NaN; with none allowed, the
///   largest non-NaN logit wins (token 0 when every logit is NaN);
/// * greedy ([`SamplingParams::is_greedy`]): the largest allowed logit, ties to the lower id;
/// * else `z_i = logit_i / T` (f32 division); top-k keeps `z_i >=` the k-th largest `z`
///   (ties at the boundary all kept); min-p keeps `z_i >= zmax + ln(min_p)` (a probability at
///   least `min_p` times the largest); top-p then keeps tokens whose mass of strictly larger kept
///   `z` is below `top_p` × the kept mass (so the crossing token and its ties stay), with
///   weights `exp(z_i - zmax)` ([`weight`]);
/// * the draw walks the kept tokens in id order and takes the first whose running mass
///   exceeds `u` × the kept mass.
pub fn choose(logits: &[f32], banned: &[u32], p: &SamplingParams, u: f64) -> usize {
    let allowed = |i: usize| !logits[i].is_nan() && !banned.contains(&(i as u32));
    if p.is_greedy() {
        return argmax(logits, allowed).unwrap_or_else(|| fallback(logits));
    }
    let Some(k) = kept_set(logits, banned, p) else {
        return fallback(logits);
    };
    let w = |z: f32| weight(z, k.zmax);
    let kept = || {
        k.z.iter()
            .enumerate()
            .filter_map(|(i, z)| z.filter(|&z| z >= k.threshold).map(|z| (i, w(z))))
    };
    let total: f64 = kept().map(|(_, x)| x).sum();
    if total <= 0.0 {
        return argmax(logits, allowed).unwrap_or_else(|| fallback(logits));
    }
    let target = u * total;
    let mut acc = 0.0;
    let mut last = 0;
    for (i, x) in kept() {
        acc += x;
        last = i;
        if acc > target {
            return i;
        }
    }
    last
}

/// How close a draw is to changing its answer under rounding: the distance of `u` × kept mass
/// from the nearer end of the chosen token's interval, and of each top-p decision from its
/// limit, relative to the mass. Backends that sum in another order may pick another token only
/// when this is tiny (a device check skips such cases). Infinite for greedy rows.
pub fn draw_margin(logits: &[f32], banned: &[u32], p: &SamplingParams, u: f64) -> f64 {
    if p.is_greedy() {
        return f64::INFINITY;
    }
    let Some(k) = kept_set(logits, banned, p) else {
        return f64::INFINITY;
    };
    let kept: Vec<f64> =
        k.z.iter()
            .filter_map(|z| z.filter(|&z| z >= k.threshold).map(|z| weight(z, k.zmax)))
            .collect();
    let total: f64 = kept.iter().sum();
    if total <= 0.0 {
        return k.top_p_margin;
    }
    let target = u * total;
    let mut acc = 0.0;
    for x in kept {
        if acc + x > target {
            let inside = (target - acc).min(acc + x - target) / total;
            return inside.min(k.top_p_margin);
        }
        acc += x;
    }
    0.0
}

/// log Σ exp(logit) over every non-NaN logit (the logprob normaliser).
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let m = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return m;
    }
    let s: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| f64::from(l - m).exp())
        .sum();
    m + s.ln() as f32
}

/// The index of the largest allowed logit; ties go to the lower index.
fn argmax(logits: &[f32], allowed: impl Fn(usize) -> bool) -> Option<usize> {
    let mut best: Option<usize> = None;
    for i in (0..logits.len()).filter(|&i| allowed(i)) {
        if best.is_none_or(|b| logits[i] > logits[b]) {
            best = Some(i);
        }
    }
    best
}

/// With nothing allowed: the largest non-NaN logit, else token 0.
fn fallback(logits: &[f32]) -> usize {
    argmax(logits, |i| !logits[i].is_nan()).unwrap_or(0)
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
    /// Keep the matched stop string at the end of the text (vLLM's
    /// `include_stop_str_in_output`).
    include: bool,
}

impl StopStrings {
    /// A matcher for `stops` (empty strings are ignored) that cuts the text before a match.
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            include: false,
        }
    }

    /// Like [`StopStrings::new`], but the matched stop string stays in the text when
    /// `include` is set (the text is cut right after it).
    pub fn including(stops: Vec<String>, include: bool) -> Self {
        StopStrings {
            include,
            ..Self::new(stops)
        }
    }

    /// Add text; returns the text safe to emit and whether a stop string was found (then
    /// the text is cut before it, or after it when it is included, and nothing more should
    /// be emitted).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.held.push_str(text);
        // The earliest match wins; at equal positions the first stop string listed.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s.len())))
            .min_by_key(|&(at, _)| at);
        if let Some((at, len)) = first {
            let end = if self.include { at + len } else { at };
            let out = self.held[..end].to_string();
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
        // The logits repeat: every token tied with the 2nd largest value stays.
        let second = l[top_n(&l, 2)[1]];
        let best: Vec<u32> = (0..l.len() as u32)
            .filter(|&i| l[i as usize] >= second)
            .collect();
        assert!(best.len() > 2);
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

    /// The tokens a draw can reach over a fine grid of uniform numbers.
    fn reachable(l: &[f32], banned: &[u32], p: &SamplingParams) -> Vec<usize> {
        let mut out: Vec<usize> = (0..1000)
            .map(|i| choose(l, banned, p, (f64::from(i) + 0.5) / 1000.0))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..Default::default()
        }
    }

    #[test]
    fn top_k_keeps_every_tie_at_the_boundary() {
        let l = vec![1.0, 3.0, 2.0, 3.0, 2.0, 0.0];
        assert_eq!(reachable(&l, &[], &params(1.0, 2, 1.0)), vec![1, 3]);
        // The 3rd largest is 2.0, held by two tokens: both stay.
        assert_eq!(reachable(&l, &[], &params(1.0, 3, 1.0)), vec![1, 2, 3, 4]);
        // k beyond the allowed count keeps everything allowed.
        assert_eq!(
            reachable(&l, &[0], &params(1.0, 9, 1.0)),
            vec![1, 2, 3, 4, 5]
        );
        // A banned token does not count towards k.
        assert_eq!(reachable(&l, &[1], &params(1.0, 2, 1.0)), vec![2, 3, 4]);
    }

    #[test]
    fn top_p_keeps_the_crossing_token_and_its_ties() {
        // Masses 4, 3, 2, 1 (of 10).
        let l: Vec<f32> = [4.0f32, 3.0, 2.0, 1.0].iter().map(|m| m.ln()).collect();
        assert_eq!(reachable(&l, &[], &params(1.0, 0, 0.39)), vec![0]);
        assert_eq!(reachable(&l, &[], &params(1.0, 0, 0.45)), vec![0, 1]);
        assert_eq!(reachable(&l, &[], &params(1.0, 0, 0.71)), vec![0, 1, 2]);
        // Masses 4, 3, 3, 1: the two 3s are tied, so both stay once the first does.
        let l: Vec<f32> = [4.0f32, 3.0, 3.0, 1.0].iter().map(|m| m.ln()).collect();
        assert_eq!(reachable(&l, &[], &params(1.0, 0, 0.5)), vec![0, 1, 2]);
        // top-p applies to what top-k kept: of masses 4 and 3, 0.6 of 7 needs both.
        assert_eq!(reachable(&l, &[], &params(1.0, 2, 0.6)), vec![0, 1, 2]);
        // Banned tokens carry no mass: without token 0, 0.5 of 7 crosses at the 3s.
        assert_eq!(reachable(&l, &[0], &params(1.0, 0, 0.5)), vec![1, 2]);
    }

    #[test]
    fn min_p_keeps_tokens_at_least_that_fraction_of_the_top_one() {
        // Masses 8, 4, 2, 1 (relative to the top: 1, 0.5, 0.25, 0.125).
        let l: Vec<f32> = [8.0f32, 4.0, 2.0, 1.0].iter().map(|m| m.ln()).collect();
        let p = |temperature, min_p| SamplingParams {
            temperature,
            min_p,
            ..Default::default()
        };
        assert_eq!(reachable(&l, &[], &p(1.0, 0.0)), vec![0, 1, 2, 3]);
        assert_eq!(reachable(&l, &[], &p(1.0, 0.3)), vec![0, 1]);
        assert_eq!(reachable(&l, &[], &p(1.0, 0.2)), vec![0, 1, 2]);
        assert_eq!(reachable(&l, &[], &p(1.0, 1.0)), vec![0]);
        // After the temperature: at T = 2 the ratios are square roots (0.71, 0.5, 0.35), so
        // 0.4 keeps three tokens where at T = 1 it keeps two.
        assert_eq!(reachable(&l, &[], &p(2.0, 0.4)), vec![0, 1, 2]);
        assert_eq!(reachable(&l, &[], &p(1.0, 0.4)), vec![0, 1]);
        // Relative to the top allowed token: with 0 banned, 4 is the top.
        assert_eq!(reachable(&l, &[0], &p(1.0, 0.3)), vec![1, 2]);
        // With top-k: the larger threshold wins; top-p then sees only what both kept.
        let with = |min_p, top_k, top_p| SamplingParams {
            min_p,
            top_k,
            top_p,
            ..Default::default()
        };
        assert_eq!(reachable(&l, &[], &with(0.2, 2, 1.0)), vec![0, 1]);
        // Kept by min-p 0.2: masses 8, 4, 2 (of 14); top-p 0.6 needs 8 and 4.
        assert_eq!(reachable(&l, &[], &with(0.2, 0, 0.6)), vec![0, 1]);
        assert!(with(0.1, 0, 1.0).needs_host_logits());
        assert!(!with(0.0, 0, 1.0).needs_host_logits());
    }

    #[test]
    fn the_draw_walks_kept_tokens_in_id_order() {
        let flat = vec![0.0f32; 4];
        let p = params(1.0, 0, 1.0);
        for (u, want) in [(0.1, 0), (0.3, 1), (0.6, 2), (0.99, 3)] {
            assert_eq!(choose(&flat, &[], &p, u), want, "u = {u}");
        }
        let two = vec![0.0, 5.0, 0.0, 5.0];
        let p = params(0.7, 2, 1.0);
        assert_eq!(choose(&two, &[], &p, 0.4), 1);
        assert_eq!(choose(&two, &[], &p, 0.6), 3);
        // The margin: distance to the nearer end of the chosen interval.
        let p = params(1.0, 0, 1.0);
        assert!((draw_margin(&flat, &[], &p, 0.125) - 0.125).abs() < 1e-12);
        assert!(draw_margin(&flat, &[], &p, 0.5) < 1e-12);
        assert_eq!(
            draw_margin(&flat, &[], &params(0.0, 0, 1.0), 0.5),
            f64::INFINITY
        );
    }

    #[test]
    fn nan_and_banned_tokens_are_never_chosen() {
        let l = vec![f32::NAN, 1.0, f32::NAN, 0.5, 3.0];
        for p in [
            params(0.0, 0, 1.0),
            params(2.0, 0, 1.0),
            params(1.0, 2, 0.9),
        ] {
            let got = reachable(&l, &[4], &p);
            assert!(got.iter().all(|t| [1, 3].contains(t)), "{p:?}: {got:?}");
        }
        // Nothing allowed: the largest non-NaN logit, even if banned; all NaN: token 0.
        assert_eq!(choose(&l, &[1, 3, 4], &params(1.0, 0, 1.0), 0.5), 4);
        assert_eq!(choose(&l, &[1, 3, 4], &params(0.0, 0, 1.0), 0.5), 4);
        assert_eq!(choose(&[f32::NAN; 3], &[], &params(1.0, 0, 1.0), 0.5), 0);
        // Infinite logits: the +inf tokens share the draw.
        let inf = vec![0.0, f32::INFINITY, 1.0, f32::INFINITY];
        assert_eq!(reachable(&inf, &[], &params(1.0, 0, 1.0)), vec![1, 3]);
        assert!((log_sum_exp(&[0.0, f32::NAN, 0.0]) - 2.0f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn sample_takes_one_uniform_per_token_from_the_seeded_stream() {
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            seed: Some(11),
            ..Default::default()
        };
        let l = logits();
        let mut a = Sampler::new(p.clone());
        let mut b = Sampler::new(p.clone());
        for _ in 0..30 {
            let u = b.next_uniform();
            assert_eq!(a.sample(&l, &[]).token as usize, choose(&l, &[], &p, u));
        }
        // Greedy rows draw nothing: a greedy sampler's stream stays where it started.
        let mut g = Sampler::new(SamplingParams {
            top_k: 1,
            seed: Some(11),
            ..Default::default()
        });
        g.sample(&l, &[]);
        assert_eq!(g.next_uniform(), Sampler::new(p).next_uniform());
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
        // Included: the text ends with the stop string, whatever followed it is dropped.
        let mut m = StopStrings::including(vec!["END".into()], true);
        assert_eq!(m.push("ab E"), ("ab ".to_string(), false));
        assert_eq!(m.push("ND tail"), ("END".to_string(), true));
    }

    fn history(prompt: &[u32], output: &[u32]) -> (HashSet<u32>, HashMap<u32, u32>) {
        let mut counts = HashMap::new();
        for &t in output {
            *counts.entry(t).or_insert(0) += 1;
        }
        (prompt.iter().copied().collect(), counts)
    }

    #[test]
    fn penalties_follow_vllm_definitions() {
        let base = vec![2.0f32, -2.0, 1.0, 4.0, 0.5];
        let (prompt, output) = history(&[0, 1], &[1, 3, 3, 3]);
        // Repetition: prompt and output tokens; positive divided, negative multiplied, once
        // even for token 1, which is in both.
        let mut l = base.clone();
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..Default::default()
        };
        apply_penalties(&mut l, &p, &prompt, &output);
        assert_eq!(l, vec![1.0, -4.0, 1.0, 2.0, 0.5]);
        // Frequency: f × count in the output only (prompt token 0 untouched).
        let mut l = base.clone();
        let p = SamplingParams {
            frequency_penalty: 0.5,
            ..Default::default()
        };
        apply_penalties(&mut l, &p, &prompt, &output);
        assert_eq!(l, vec![2.0, -2.5, 1.0, 2.5, 0.5]);
        // Presence: p once per token in the output.
        let mut l = base.clone();
        let p = SamplingParams {
            presence_penalty: 1.5,
            ..Default::default()
        };
        apply_penalties(&mut l, &p, &prompt, &output);
        assert_eq!(l, vec![2.0, -3.5, 1.0, 2.5, 0.5]);
        // Negative values reward repeats, as in vLLM.
        let mut l = base.clone();
        let p = SamplingParams {
            presence_penalty: -1.0,
            ..Default::default()
        };
        apply_penalties(&mut l, &p, &prompt, &output);
        assert_eq!(l[3], 5.0);
    }

    #[test]
    fn defaults_leave_greedy_unchanged_and_penalties_break_a_repeat() {
        // The same logits every step: greedy repeats token 3 forever.
        let l = vec![0.0f32, 1.0, 2.0, 3.0];
        let run = |p: SamplingParams, prompt: &[u32]| {
            let mut s = Sampler::for_prompt(p, prompt);
            (0..4).map(|_| s.sample(&l, &[]).token).collect::<Vec<_>>()
        };
        let greedy = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        assert!(!greedy.has_penalties());
        assert_eq!(run(greedy.clone(), &[3]), vec![3, 3, 3, 3]);
        // Frequency 0.6 grows with the count: 3 → 2.4 (still first), 1.8 (2 wins), then
        // 1.8 beats 2 − 0.6.
        let freq = SamplingParams {
            frequency_penalty: 0.6,
            ..greedy.clone()
        };
        assert!(freq.has_penalties());
        assert_eq!(run(freq, &[]), vec![3, 3, 2, 3]);
        // Repetition reads the prompt and does not grow: 3 in the prompt gives 3 / 2 = 1.5,
        // so 2 wins once, after which 2 / 2 = 1 < 1.5.
        let rep = SamplingParams {
            repetition_penalty: 2.0,
            ..greedy.clone()
        };
        assert_eq!(run(rep.clone(), &[3]), vec![2, 3, 3, 3]);
        // Logprobs stay those of the unmodified logits.
        let mut s = Sampler::for_prompt(
            SamplingParams {
                logprobs: Some(1),
                ..rep
            },
            &[3],
        );
        let out = s.sample(&l, &[]);
        assert_eq!(out.token, 2);
        assert!((out.logprob.unwrap() - (2.0 - log_sum_exp(&l))).abs() < 1e-6);
        assert_eq!(out.top[0].0, 3);
    }

    #[test]
    fn logit_bias_forces_and_bans_under_greedy() {
        let logits = vec![0.0f32, 5.0, 1.0, -3.0];
        let greedy = |bias: Vec<(u32, f32)>| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 0.0,
                logprobs: Some(1),
                logit_bias: bias,
                ..Default::default()
            });
            s.sample(&logits, &[])
        };
        assert_eq!(greedy(vec![]).token, 1);
        // +100 forces the weakest token; -100 bans the best, the next best wins.
        let forced = greedy(vec![(3, 100.0)]);
        assert_eq!(forced.token, 3);
        assert_eq!(greedy(vec![(1, -100.0)]).token, 2);
        // Logprobs stay those of the raw logits.
        let lse = log_sum_exp(&logits);
        assert_eq!(forced.logprob, Some(-3.0 - lse));
        assert!(
            SamplingParams {
                logit_bias: vec![(0, 1.0)],
                ..Default::default()
            }
            .needs_host_logits()
        );
        assert!(!SamplingParams::default().needs_host_logits());
    }
}
