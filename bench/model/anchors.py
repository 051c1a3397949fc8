"""Published anchors: shapes at which a kernel's authors or users published a figure, with the
figure, the hardware it was taken on and where it was published (``--preset anchors`` on a GPU,
or ``--anchors NAME,...``).

Each anchor is one case (its batch, heads, lengths, head dim, mask, direction and dtype) and one
published figure.  A figure in TFLOPS or GB/s is turned into the time it implies with the
publisher's own way of counting (``Anchor.published_ms``), so that a measured time is held against
it whatever attnbench counts as the FLOPs of a masked or backward call: the report's ratio is
published time / measured time, the speed reached as a fraction of the anchor's.

Counting conventions:
  fa         FlashAttention's benchmarks, tritonbench and FlashAttention issues: a forward is
             4 * batch * heads * q * k * d FLOPs, half of it under a causal mask; a backward 2.5 times
             the forward, forward and backward 3.5 times.
  mla-flops  FlashMLA's decode test: 2 * batch * q * heads * kv * (d_qk + d_v).
  mla-bytes  FlashMLA's decode test: 2 bytes for each element of the KV cache (batch * kv * kv_heads
             * d_qk), of q (batch * q * heads * d_qk) and of the output (batch * q * heads * d_v).
  ms         the time itself.

Figures taken from issue threads are one person's run on one machine: the source says which.
"""

from __future__ import annotations

from dataclasses import dataclass

UNITS = ("TFLOPS", "GB/s", "ms")
CONVENTIONS = ("fa", "mla-flops", "mla-bytes", "ms")
PASSES = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # the fa convention's backward and training-step FLOPs


@dataclass(frozen=True)
class Anchor:
    name: str
    kernel: str  # what was published: "FlashAttention-3", "cuDNN", ...
    chip: str  # the GPU model as it appears in a device name: H100, H20, H800, B200
    hardware: str  # as the source gives it
    figure: float
    unit: str  # UNITS
    convention: str  # CONVENTIONS: how the source counts the work behind its figure
    source: str  # where it was published
    batch: int
    heads: int
    q_len: int
    head_dim: int
    dtype: str
    kv_heads: int | None = None  # None: = heads
    kv_len: int | None = None  # None: = q_len
    head_dim_v: int | None = None  # MLA: v's head dim apart
    mask: str = "none"
    align: str = "top-left"
    direction: str = "fwd"
    kv_layout: str = "contiguous"
    note: str = ""

    @property
    def kv(self) -> int:
        return self.kv_len or self.q_len

    @property
    def kvh(self) -> int:
        return self.kv_heads or self.heads

    def case_fields(self) -> dict:
        """The fields of the case this anchor names (bench.model.case.Case), device aside."""
        return {"dtype": self.dtype, "batch": self.batch, "heads": self.heads, "kv_heads": self.kvh,
                "q_len": self.q_len, "kv_len": self.kv, "head_dim": self.head_dim, "head_dim_v": self.head_dim_v,
                "mask": self.mask, "window": None, "direction": self.direction, "align": self.align,
                "kv_layout": self.kv_layout}

    def work(self) -> float:
        """What the figure counts, as its source counts it: FLOPs, bytes, or 1 for a time."""
        dv = self.head_dim_v or self.head_dim
        if self.convention == "fa":
            flops = 4.0 * self.batch * self.heads * self.q_len * self.kv * self.head_dim
            return flops * (0.5 if self.mask == "causal" else 1.0) * PASSES[self.direction]
        if self.convention == "mla-flops":
            return 2.0 * self.batch * self.q_len * self.heads * self.kv * (self.head_dim + dv)
        if self.convention == "mla-bytes":
            return 2.0 * (self.batch * self.kv * self.kvh * self.head_dim
                          + self.batch * self.q_len * self.heads * (self.head_dim + dv))
        return 1.0

    def published_ms(self) -> float:
        """The time the published figure implies at this shape."""
        if self.unit == "ms":
            return self.figure
        scale = 1e12 if self.unit == "TFLOPS" else 1e9
        return self.work() / (self.figure * scale) * 1e3


_TB_2391 = "https://github.com/pytorch/benchmark/pull/2391"
_TB_141 = "https://github.com/meta-pytorch/tritonbench/issues/141"
_FA_1051 = "https://github.com/Dao-AILab/flash-attention/issues/1051"
_FA_1310 = "https://github.com/Dao-AILab/flash-attention/issues/1310"
_FA_2280 = "https://github.com/Dao-AILab/flash-attention/pull/2280"
_FA_1572 = "https://github.com/Dao-AILab/flash-attention/issues/1572"
_MLA = "https://github.com/deepseek-ai/FlashMLA (README, release of 2025-04-22)"
_H100_TB = "H100 (Meta's tritonbench runs)"
_H20 = "H20 (148 TFLOPS fp16 tensor, 4.0 TB/s)"
_H20_NOTE = ("hopper/benchmark_attn.py: heads = 2048 / head dim, bf16; one user's H20, FlashAttention at its "
             "late-2024 commit")
_MLA_NOTE = ("the README's ceiling ('up to'), not a figure at this shape; the shape is DeepSeek-V3's MLA decode "
             "(d 576/512, one latent KV head, 4096 cached tokens, batch 128)")


def _h20(kernel: str, figure: float, head_dim: int, mask: str) -> Anchor:
    tag = {"FlashAttention-2": "fa2", "FlashAttention-3": "fa3", "cuDNN": "cudnn"}[kernel]
    return Anchor(f"{tag}-h20-d{head_dim}-{'causal' if mask == 'causal' else 'full'}-2k", kernel, "H20", _H20,
                  figure, "TFLOPS", "fa", _FA_1310, batch=2, heads=2048 // head_dim, q_len=2048, head_dim=head_dim,
                  dtype="bfloat16", mask=mask, note=_H20_NOTE)


ANCHORS: tuple[Anchor, ...] = (
    # FlashAttention-3 forward on H100, the paper's setting (batch x n = 16k tokens, 16 heads of 128), in tritonbench
    Anchor("fa3-h100-d128-512", "FlashAttention-3", "H100", _H100_TB, 430.32, "TFLOPS", "fa", _TB_2391,
           batch=32, heads=16, q_len=512, head_dim=128, dtype="float16", note="batch x n = 16k tokens"),
    Anchor("fa3-h100-d128-2k", "FlashAttention-3", "H100", _H100_TB, 565.544, "TFLOPS", "fa", _TB_2391,
           batch=8, heads=16, q_len=2048, head_dim=128, dtype="float16", note="batch x n = 16k tokens"),
    Anchor("fa3-h100-d128-16k", "FlashAttention-3", "H100", _H100_TB, 620.73, "TFLOPS", "fa", _TB_2391,
           batch=1, heads=16, q_len=16384, head_dim=128, dtype="float16", note="batch x n = 16k tokens"),
    # cuDNN against FlashAttention-3 at one shape, in tritonbench's issues
    Anchor("cudnn-h100-d128-8k", "cuDNN", "H100", _H100_TB, 581.868, "TFLOPS", "fa", _TB_141,
           batch=8, heads=16, q_len=8192, head_dim=128, dtype="float16"),
    Anchor("fa3-h100-d128-8k", "FlashAttention-3", "H100", _H100_TB, 465.518, "TFLOPS", "fa", _TB_141,
           batch=8, heads=16, q_len=8192, head_dim=128, dtype="float16"),
    # FlashAttention-2 and -3, forward and backward, at 32k on H100
    *(Anchor(f"{tag}-h100-d128-32k-{d}", kernel, "H100", "H100", fig, "TFLOPS", "fa", _FA_1051,
             batch=1, heads=8, q_len=32768, head_dim=128, dtype="bfloat16", direction=d,
             note="mask and dtype not stated in the thread (taken as none, bf16); FlashAttention-3 at its July 2024 "
                  "beta")
      for tag, kernel, d, fig in (("fa2", "FlashAttention-2", "fwd", 355.0),
                                  ("fa2", "FlashAttention-2", "bwd", 337.0),
                                  ("fa3", "FlashAttention-3", "fwd", 500.0),
                                  ("fa3", "FlashAttention-3", "bwd", 305.0))),
    # FlashAttention-2, -3 and cuDNN at d 64 and 128, causal and not, on H20
    *(_h20(kernel, fig, d, mask)
      for d, mask, figs in ((64, "none", (81.8, 120.1, 126.1)), (64, "causal", (71.0, 100.3, 109.1)),
                            (128, "none", (83.7, 126.2, 129.1)), (128, "causal", (65.9, 107.8, 107.8)))
      for kernel, fig in zip(("FlashAttention-2", "FlashAttention-3", "cuDNN"), figs)),
    # FlashAttention's CuTe DSL kernels on Blackwell (sm100), forward and backward, causal and not
    *(Anchor(f"fa-cute-b200-d128-8k-{d}-{'causal' if m == 'causal' else 'full'}", "FlashAttention (CuTe DSL, sm100)",
             "B200", "Blackwell sm100 (B200 class)", fig, "TFLOPS", "fa", _FA_2280, batch=4, heads=16, q_len=8192,
             head_dim=128, dtype="bfloat16", mask=m, direction=d, note="backward: the 2-CTA path")
      for d, m, fig in (("fwd", "none", 1534.8), ("fwd", "causal", 1418.1), ("bwd", "none", 1359.8),
                        ("bwd", "causal", 1208.6))),
    # FlashMLA decode: the README's memory-bound and compute-bound ceilings
    Anchor("flashmla-h800-memory", "FlashMLA", "H800", "H800 SXM5, CUDA 12.8", 3000.0, "GB/s", "mla-bytes", _MLA,
           batch=128, heads=16, kv_heads=1, q_len=1, kv_len=4096, head_dim=576, head_dim_v=512, dtype="bfloat16",
           mask="causal", align="bottom-right", note=_MLA_NOTE + "; 16 query heads: memory-bound"),
    Anchor("flashmla-h800-compute", "FlashMLA", "H800", "H800 SXM5, CUDA 12.8", 660.0, "TFLOPS", "mla-flops", _MLA,
           batch=128, heads=128, kv_heads=1, q_len=1, kv_len=4096, head_dim=576, head_dim_v=512, dtype="bfloat16",
           mask="causal", align="bottom-right", note=_MLA_NOTE + "; 128 query heads: compute-bound"),
    # FlashInfer's paged decode against FlashAttention-3's, in FlashAttention's issues
    *(Anchor(f"flashinfer-h20-decode-{kv}", "FlashInfer", "H20", _H20, ms, "ms", "ms", _FA_1572, batch=16, heads=32,
             q_len=1, kv_len=kv, head_dim=128, dtype="float16", mask="causal", align="bottom-right",
             kv_layout="paged:8", note="paged KV, 8 tokens a page; the thread's author ran it on H20")
      for kv, ms in ((4000, 0.3214272022247314), (32000, 2.474928092956543))),
)

BY_NAME = {a.name: a for a in ANCHORS}
NAMES = tuple(BY_NAME)


def select(names) -> list[Anchor]:
    """The anchors named (``all``: every one), in the table's order."""
    names = list(names or [])
    if "all" in names:
        return list(ANCHORS)
    return [BY_NAME[n] for n in NAMES if n in names]


def chips_in(device_name: str | None) -> set[str]:
    """The GPU model words of a device name ("NVIDIA H100 80GB HBM3" -> {"H100", ...})."""
    return {w.upper() for w in str(device_name or "").replace("-", " ").split()}
