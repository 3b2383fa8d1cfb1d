// CPU kernels on raw contiguous f32 buffers (row-major). No autograd here: the differentiable ops in
// autograd/ops.cpp call these and define the backward beside the forward.
//
// Each kernel states its buffer shapes. Shape letters: B batch, T sequence length, C channels,
// H heads, V vocabulary, N rows (any flattening of leading dimensions).
#pragma once

#include <cstdint>

namespace zero::cpu {

/// Number of threads used by the kernels (OpenMP).
void set_num_threads(int n);
int num_threads();

/// C[M,N] = alpha * op(A) @ op(B) + beta * C (+ bias[N] added to every row, when bias is not null),
/// row-major; op(A) is [M,K] (A stored [K,M] if trans_a), op(B) is [K,N] (B stored [N,K] if trans_b).
/// lda/ldb/ldc are row strides in elements. C is not read when beta == 0 (it may hold garbage).
/// Our own blocked GEMM on a register tile (kernels.cpp; faster than Eigen's at these shapes, see
/// docs/performance.md), threaded over rows of C; every element is summed over k in the same order
/// for any thread count.
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
          const float* bias = nullptr);

/// out[N,C] = (inp - mean) * rstd * weight + bias per row; saves mean[N], rstd[N] for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       std::int64_t N, std::int64_t C, float eps);
/// dinp[N,C] = (overwritten), dweight[C] and dbias[C] += contributions. Math: Ba et al. 2016, as in llm.c.
/// dweight/dbias are summed in fixed blocks of rows, so the result does not depend on the thread count.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t N, std::int64_t C);

/// GELU, tanh approximation (Hendrycks & Gimpel 2016): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
void gelu_forward(float* out, const float* inp, std::int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);

/// Row softmax: out[N,C] = softmax(inp[N,C]) along C.
void softmax_forward(float* out, const float* inp, std::int64_t N, std::int64_t C);
/// dinp[N,C] = out * (dout - sum(dout * out)) per row.
void softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, std::int64_t C);

/// Causal multi-head self-attention (Vaswani et al. 2017), fused: qkv[B,T,3C] holds q | k | v along the
/// last dimension, head h uses channels [h*D, (h+1)*D) of each, D = C/H. att[B,H,T,T] receives the
/// softmax probabilities (zero above the diagonal), out[B,T,C] the heads' outputs side by side.
/// Threads split the B·H heads; only the causal part of each product is computed. Fastest when T is a
/// multiple of 32, D of the register tile width and att 64-byte aligned (read and written in place).
void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                       std::int64_t H);
/// dqkv[B,T,3C] (overwritten) from dout[B,T,C], the saved att and qkv.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                        std::int64_t T, std::int64_t C, std::int64_t H);

/// Mean cross-entropy of logits[N,V] against targets[N]; probs[N,V] receives the softmax. Returns the
/// mean loss over the N rows. Throws zero::Error for a target outside [0, V).
float cross_entropy_forward(float* probs, const float* logits, const std::int64_t* targets, std::int64_t N,
                            std::int64_t V);
/// dlogits[N,V] = (probs - onehot(targets)) * dloss / N.
void cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets, float dloss,
                            std::int64_t N, std::int64_t V);

/// out[N,C] = weight[idx[n], :]. Throws zero::Error for an index outside [0, V).
void embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N, std::int64_t V,
                       std::int64_t C);
/// dweight[V,C] += scatter of dout[N,C] by idx[N].
void embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N, std::int64_t C);

}  // namespace zero::cpu
