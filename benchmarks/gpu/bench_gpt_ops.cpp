// gpu_bench, gpt2-124m ops: each of our transformer kernels (kernels/cuda/transformer.cu) at
// the shapes of one gpt2-124m training step (batch 8 x 1024 tokens, width 768, 12 heads,
// vocabulary 50304), timed alone, with the calls per step, so the table says where a step's
// time goes besides the cuBLAS GEMMs. Each row's rate is against a reference measured in the
// same run: attention's TFLOP/s over the large bf16 GEMM's, the memory-bound ops' GB/s over
// the device copy's. Bytes are the least each op must move (every input read once, every
// output written once); attention's FLOPs are the causal products it must do (forward 2,
// backward 4, matrix products of q k^T's size). Attention rows name the path that ran
// (cuDNN's fused attention or our kernel); when it was cuDNN, our kernel's rows follow as the
// reference, with 0 calls per step. The values are not checked here (gpu_ops checks every op
// against the CPU).
#include <cstdlib>

#include "benchmarks/gpu/bench_common.hpp"
#include "benchmarks/gpu/bench_sections.hpp"
#include "kernels/cuda/cudnn_attention.hpp"

namespace ringtrain::gpubench {

std::vector<OpRow> bench_gpt_ops(kernels::Backend& be, cudaStream_t s, DType t, int64_t batch,
                                 int64_t seq, double gemm_tflops, double copy_gbps) {
  constexpr int64_t kLayers = 12, kHeads = 12, kWidth = 768;
  constexpr int64_t kVocab = 50257, kPadded = 50304;  // GPT-2's tokens, the rows of wte
  const int64_t n = batch * seq, c = kWidth, e = int64_t(dtype_size(t));
  std::vector<OpRow> rows;
  auto add_row = [&](const char* op, double calls, double sec, double work, bool flops) {
    const double rate = work / sec / (flops ? 1e12 : 1e9);
    const double ref = flops ? gemm_tflops : copy_gbps;
    rows.push_back({op, dtype_name(t), sec * 1e3, calls, sec * 1e3 * calls, rate,
                    flops ? "TFLOP/s" : "GB/s", ref > 0 ? rate / ref : 0, ""});
  };
  const int warm = 1, iters = 3;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t st = 11;
  for (auto& id : ids) id = int32_t(splitmix64(st) % uint64_t(kVocab));
  OwnedTensor x;  // the embedding's output [B, T, C], then every [B T, C] op's input
  x.ensure({batch, seq, c}, t, kGpu);
  const Tensor x2(x.view.data, {n, c}, t, kGpu);

  {  // Embedding: token + position gather, and the scatter-add into fp32 gradients.
    OwnedTensor tok, wte, wpe, dwte, dwpe;
    copy_bytes(tok.ensure({batch, seq}, DType::i32, kGpu).data, kGpu, ids.data(), Device{},
               ids.size() * 4);
    fill_uniform(wte.ensure({kPadded, c}, t, kGpu), 21);
    fill_uniform(wpe.ensure({seq, c}, t, kGpu), 22);
    dwte.ensure({kPadded, c}, DType::f32, kGpu);
    dwpe.ensure({seq, c}, DType::f32, kGpu);
    add_row("embedding forward", 1,
            time_it(s, warm, iters,
                    [&] { be.embedding_forward(tok.view, wte.view, &wpe.view, x.view); }),
            double(3 * n * c * e), false);
    add_row("embedding backward", 1,
            time_it(s, warm, iters,
                    [&] { be.embedding_backward(tok.view, x.view, dwte.view, &dwpe.view); }),
            double(n * c * e + kPadded * c * 4 + seq * c * 4), false);
  }
  {  // Layer norm (two per block and ln_f), fp32 statistics; the residual adds.
    OwnedTensor g, b, y, mean, rstd, dy, dx, dg, db;
    fill_uniform(g.ensure({c}, DType::f32, kGpu), 24);
    fill_uniform(b.ensure({c}, DType::f32, kGpu), 25);
    y.ensure({n, c}, t, kGpu);
    mean.ensure({n}, DType::f32, kGpu);
    rstd.ensure({n}, DType::f32, kGpu);
    fill_uniform(dy.ensure({n, c}, t, kGpu), 26);
    dx.ensure({n, c}, t, kGpu);
    dg.ensure({c}, DType::f32, kGpu);
    db.ensure({c}, DType::f32, kGpu);
    add_row("layer norm forward", 2 * kLayers + 1,
            time_it(s, warm, iters,
                    [&] {
                      be.layernorm_forward(x2, g.view, b.view, 1e-5f, y.view, mean.view, rstd.view);
                    }),
            double(2 * n * c * e), false);
    add_row("layer norm backward", 2 * kLayers + 1,
            time_it(s, warm, iters,
                    [&] {
                      be.layernorm_backward(x2, dy.view, g.view, mean.view, rstd.view, dx.view,
                                            dg.view, db.view);
                    }),
            double(3 * n * c * e), false);
    add_row("residual add", 2 * kLayers,
            time_it(s, warm, iters, [&] { be.add(x2, dy.view, y.view); }), double(3 * n * c * e),
            false);
  }
  {  // Attention over qkv [B, T, 3C].
    OwnedTensor qkv, out, lse, dout, dqkv;
    fill_uniform(qkv.ensure({batch, seq, 3 * c}, t, kGpu), 27);
    out.ensure({batch, seq, c}, t, kGpu);
    lse.ensure({batch, kHeads, seq}, DType::f32, kGpu);
    fill_uniform(dout.ensure({batch, seq, c}, t, kGpu), 28);
    dqkv.ensure({batch, seq, 3 * c}, t, kGpu);
    // One causal product of q k^T's size: 2 FLOP x B x C x T (T + 1) / 2.
    const double product = double(batch) * double(c) * double(seq) * double(seq + 1);
    // Forward and backward rows under the path chosen as the GPT runs it; each row names the
    // path its calls took. Backward reads the lse its own path's forward wrote.
    auto attention_rows = [&](const char* suffix) {
      auto before = kernels::cuda::attention_calls();
      add_row(cat("attention forward", suffix).c_str(), kLayers,
              time_it(s, warm, iters,
                      [&] { be.attention_forward(kHeads, qkv.view, out.view, lse.view); }),
              2 * product, true);
      rows.back().path =
          kernels::cuda::attention_paths_between(before, kernels::cuda::attention_calls());
      before = kernels::cuda::attention_calls();
      add_row(cat("attention backward", suffix).c_str(), kLayers,
              time_it(s, warm, iters,
                      [&] {
                        be.attention_backward(kHeads, qkv.view, out.view, dout.view, lse.view,
                                              dqkv.view);
                      }),
              4 * product, true);
      rows.back().path =
          kernels::cuda::attention_paths_between(before, kernels::cuda::attention_calls());
      return rows.back().path;
    };
    if (attention_rows("") == "cudnn") {
      // Our kernel on the same buffers, as the reference (not counted in the step's sum).
      const char* was = std::getenv("RINGTRAIN_CUDA_ATTENTION");
      const std::string saved = was ? was : "";
      setenv("RINGTRAIN_CUDA_ATTENTION", "kernel", 1);
      attention_rows(" (our kernel, reference)");
      if (was)
        setenv("RINGTRAIN_CUDA_ATTENTION", saved.c_str(), 1);
      else
        unsetenv("RINGTRAIN_CUDA_ATTENTION");
      for (size_t i = rows.size() - 2; i < rows.size(); ++i)
        rows[i].calls_per_step = rows[i].ms_per_step = 0;
    }
  }
  {  // GELU (tanh) over the MLP's [B T, 4C].
    OwnedTensor h, hy, hdy, hdx;
    fill_uniform(h.ensure({n, 4 * c}, t, kGpu), 29);
    hy.ensure({n, 4 * c}, t, kGpu);
    fill_uniform(hdy.ensure({n, 4 * c}, t, kGpu), 30);
    hdx.ensure({n, 4 * c}, t, kGpu);
    add_row("gelu forward", kLayers,
            time_it(s, warm, iters, [&] { be.gelu_tanh(h.view, hy.view); }),
            double(2 * n * 4 * c * e), false);
    add_row("gelu backward", kLayers,
            time_it(s, warm, iters, [&] { be.gelu_tanh_backward(h.view, hdy.view, hdx.view); }),
            double(3 * n * 4 * c * e), false);
  }
  {  // The fused token cross-entropy over fp32 logits [B T, padded V], gradient in place:
     // each call's gradient (finite, small) is the next call's logits.
    OwnedTensor logits, targets;
    fill_uniform(logits.ensure({n, kPadded}, DType::f32, kGpu), 31);
    copy_bytes(targets.ensure({n}, DType::i32, kGpu).data, kGpu, ids.data(), Device{},
               ids.size() * 4);
    add_row("token cross-entropy + gradient", 1,
            time_it(s, warm, iters,
                    [&] { be.token_xent(logits.view, targets.view, kVocab, 1.f, &logits.view); }),
            double(2 * n * kPadded * 4), false);
  }
  return rows;
}

}  // namespace ringtrain::gpubench
