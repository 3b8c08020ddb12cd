//! Speed of the client's hot path: SSE framing + chunk JSON decoding + per-token bookkeeping.
//! The client must never be what limits a measurement; figures go into docs/perf.md.

use std::convert::Infallible;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mxtune::bench::sse::parse_chunk;
use mxtune::bench::trace::{ErrorKind, RequestTrace, consume_sse};

/// A vLLM-shaped stream: role chunk, `chunks` token chunks of `per_chunk` tokens each (with
/// token ids), usage chunk, `[DONE]`; one network read per SSE event.
fn stream(chunks: usize, per_chunk: usize) -> Vec<Vec<u8>> {
    let mut out = vec![
        br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-oss-120b","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#
            .iter()
            .chain(b"\n\n")
            .copied()
            .collect(),
    ];
    for i in 0..chunks {
        let ids: Vec<String> = (0..per_chunk)
            .map(|k| (1000 + i * per_chunk + k).to_string())
            .collect();
        let field = if i < chunks / 2 {
            "reasoning_content"
        } else {
            "content"
        };
        out.push(
            format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-oss-120b\",\"choices\":[{{\"index\":0,\"delta\":{{\"{field}\":\" token{i}\",\"token_ids\":[{}]}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
                ids.join(",")
            )
            .into_bytes(),
        );
    }
    out.push(
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{{\"prompt_tokens\":2048,\"completion_tokens\":{},\"total_tokens\":0}}}}\n\ndata: [DONE]\n\n",
            chunks * per_chunk
        )
        .into_bytes(),
    );
    out
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("client");
    for (chunks, per_chunk) in [(1024, 1), (256, 4)] {
        let data = stream(chunks, per_chunk);
        g.throughput(Throughput::Elements(chunks as u64));
        g.bench_function(format!("consume_sse/{chunks}x{per_chunk}tok"), |b| {
            b.iter(|| {
                let epoch = Instant::now();
                let mut trace = RequestTrace::started(epoch, (chunks * per_chunk) as u32);
                let items = futures::stream::iter(
                    data.iter().map(|v| Ok::<&[u8], Infallible>(v.as_slice())),
                );
                futures::executor::block_on(consume_sse(items, epoch, &mut trace, true, |_| {
                    ErrorKind::Transport
                }));
                assert_eq!(trace.completion_tokens, (chunks * per_chunk) as u64);
                trace
            })
        });
    }
    let one = String::from_utf8(stream(2, 1)[1].clone()).unwrap();
    let payload = one.trim().trim_start_matches("data: ").to_owned();
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse_chunk", |b| b.iter(|| parse_chunk(&payload)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
