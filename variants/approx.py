"""Approximate attention: timed like the exact variants, with their error against the float64
softmax reference in every row (relative Frobenius error, max abs error, cosine similarity).

* ``linear.elu`` -- Katharopoulos et al. 2020, "Transformers are RNNs": the softmax kernel
  exp(q.k) replaced by phi(q).phi(k) with phi(x) = elu(x) + 1, so that
  out_i = phi(q_i) S / phi(q_i) z with S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j):
  O(n) time and memory.  Causal through prefix sums of S and z, taken block by block
  (blocks of CAUSAL_BLOCK queries: exact within a block, a running state across blocks).
  A different kernel, not an estimate of softmax: it declares no error budget.
* ``performer`` -- Choromanski et al. 2021, FAVOR+: positive orthogonal random features
  phi(x) = exp(w_r.x - |x|^2 / 2) / sqrt(m), r = 1..m, with x = q / d^(1/4) (and k), an
  unbiased estimate of exp(q.k / sqrt(d)).  The projection w (m x d, orthogonal blocks of
  Gaussian rows rescaled to chi-distributed norms) is seeded, the same for every head;
  ``m`` (FEATURES) is its parameter (``performer_variant`` registers another).  Causal as
  linear.elu.  The estimator's variance grows as exp(|q|^2 + |k|^2): on the harness's
  standard-normal inputs (logits of unit spread) one kernel value is off by 84% on average
  at m = 256 (7% when the logits' spread is 0.3), and the output's relative error is above
  1, so it declares no budget: its error is reported, not held to one.
* ``nystrom`` -- Xiong et al. 2021, Nystromformer: LANDMARKS landmarks per sequence, the
  means of equal segments of q and of k; softmax(Q K~^T) pinv(softmax(Q~ K~^T))
  softmax(Q~ K^T) V, with the paper's iterative pseudo-inverse (PINV_ITERS Newton-Schulz
  steps; the exact pinv of that ill-conditioned kernel does worse: relative error 4.4 against
  0.56 at n = 256).  Bidirectional only (mask none), as in the paper.  Its budget, a relative
  error of 1.0, is that of answering zeros: it must beat knowing nothing.

Queries and keys share one position space (top-left), as every mask in bench.masks; with
q_len != kv_len the causal prefix sums run over max(q_len, kv_len) positions.
"""

import math

import torch
import torch.nn.functional as F

from bench.registry import variant

CAUSAL_BLOCK = 64
FEATURES = 256
LANDMARKS = 64
PINV_ITERS = 6
SEED = 0


def _repeat_kv(case, k, v):
    group = case.heads // case.kv_heads
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return k, v


def _linear(fq, fk, v, causal: bool, eps: float):
    """sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j), over all j or over j <= i."""
    if not causal:
        num = fq @ (fk.transpose(-1, -2) @ v)
        den = fq @ fk.sum(-2, keepdim=True).transpose(-1, -2)
        return num / (den + eps)
    lq, lk = fq.shape[2], fk.shape[2]
    n = max(lq, lk)  # one position space: pad to it; keys past lk keep nothing
    fq = F.pad(fq, (0, 0, 0, n - lq))
    fk, v = F.pad(fk, (0, 0, 0, n - lk)), F.pad(v, (0, 0, 0, n - lk))
    state = fk.new_zeros(*fk.shape[:2], fk.shape[-1], v.shape[-1])
    norm = fk.new_zeros(*fk.shape[:2], 1, fk.shape[-1])
    outs = []
    for s in range(0, lq, CAUSAL_BLOCK):
        e = min(n, s + CAUSAL_BLOCK)
        qb, kb, vb = fq[:, :, s:e], fk[:, :, s:e], v[:, :, s:e]
        inner = (qb @ kb.transpose(-1, -2)).tril()  # j <= i inside the block
        num = qb @ state + inner @ vb
        den = qb @ norm.transpose(-1, -2) + inner.sum(-1, keepdim=True)
        outs.append(num / (den + eps))
        state = state + kb.transpose(-1, -2) @ vb
        norm = norm + kb.sum(-2, keepdim=True)
    return torch.cat(outs, dim=2)[:, :, :lq]


@variant("linear.elu", masks=("none", "causal"), approximate=True, colour=12,
         description="linear attention, phi(x) = elu(x) + 1 (Katharopoulos et al. 2020); O(n), causal by "
                     "prefix sums; a different kernel from softmax, so its error is reported, not budgeted")
def linear_elu(case):
    causal = case.mask == "causal"

    def attention(q, k, v):
        k, v = _repeat_kv(case, k, v)
        fq, fk = F.elu(q.float()) + 1, F.elu(k.float()) + 1
        return _linear(fq, fk, v.float(), causal, 1e-6).to(q.dtype)

    return attention


def orthogonal_features(m: int, d: int, seed: int) -> torch.Tensor:
    """(m, d) rows: orthogonal blocks of d Gaussian directions, each row rescaled to the norm
    of a Gaussian vector (FAVOR+'s ORF), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(math.ceil(m / d)):
        q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
        blocks.append(q.T)
    w = torch.cat(blocks)[:m]
    return w * torch.randn(m, d, generator=g).norm(dim=1, keepdim=True)


def performer_variant(name: str, features: int = FEATURES, seed: int = SEED, error_budget: float | None = None,
                      colour: int | None = None):
    """Register a FAVOR+ variant with ``features`` random features (``colour``: its palette slot)."""

    def factory(case):
        causal = case.mask == "causal"
        w = orthogonal_features(features, case.head_dim, seed).to(case.device)
        scale = case.head_dim ** -0.25

        def phi(x, is_query):
            x = x.float() * scale
            proj = x @ w.T  # (B, H, L, m)
            # the stabiliser cancels between numerator and denominator: per row for queries,
            # one constant for keys
            shift = proj.amax(-1, keepdim=True) if is_query else proj.amax()
            return torch.exp(proj - (x * x).sum(-1, keepdim=True) / 2 - shift.detach()) / math.sqrt(features)

        def attention(q, k, v):
            k, v = _repeat_kv(case, k, v)
            return _linear(phi(q, True), phi(k, False), v.float(), causal, 1e-12).to(q.dtype)

        return attention

    variant(name, masks=("none", "causal"), approximate=True, error_budget=error_budget, colour=colour,
            description=f"Performer FAVOR+: {features} positive orthogonal random features (Choromanski et al. "
                        f"2021), seeded; O(n), causal by prefix sums")(factory)


performer_variant("performer", colour=10)


def pinv_iterative(a: torch.Tensor, iters: int = PINV_ITERS) -> torch.Tensor:
    """The Nystromformer's Moore-Penrose pseudo-inverse: Newton-Schulz-type iterations
    Z <- Z (13 I - AZ (15 I - AZ (7 I - AZ))) / 4 from Z0 = A^T / (||A||_1 ||A||_inf)."""
    eye = torch.eye(a.shape[-1], device=a.device, dtype=a.dtype)
    z = a.transpose(-1, -2) / (a.abs().sum(-1).amax(-1)[..., None, None] * a.abs().sum(-2).amax(-1)[..., None, None])
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


@variant("nystrom", masks=("none",), approximate=True, error_budget=1.0, colour=2,
         description=f"Nystromformer (Xiong et al. 2021): {LANDMARKS} segment-mean landmarks and the "
                     "pseudo-inverse of their softmax kernel; O(n), bidirectional")
def nystrom(case):
    scale = case.scale

    count = min(case.q_len, case.kv_len, LANDMARKS)  # as many for q as for k: a square kernel to invert

    def landmarks(x):  # (B, H, L, D) -> (B, H, count, D), means of equal segments
        b, h, length, d = x.shape
        pooled = F.adaptive_avg_pool1d(x.reshape(b * h, length, d).transpose(1, 2), count)
        return pooled.transpose(1, 2).reshape(b, h, -1, d)

    def attention(q, k, v):
        k, v = _repeat_kv(case, k, v)
        q32, k32, v32 = q.float(), k.float(), v.float()
        ql, kl = landmarks(q32), landmarks(k32)
        f = ((q32 @ kl.transpose(-1, -2)) * scale).softmax(-1)
        a = ((ql @ kl.transpose(-1, -2)) * scale).softmax(-1)
        b = ((ql @ k32.transpose(-1, -2)) * scale).softmax(-1)
        return (f @ (pinv_iterative(a) @ (b @ v32))).to(q.dtype)

    return attention
