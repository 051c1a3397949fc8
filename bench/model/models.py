"""Published model shapes for ``--model NAME``: the attention settings of each model's layers, from
its configuration as published (the source is given).  A model sets the heads, the KV heads, the
head dims, the masks and the dtype of a sweep; its other settings (lengths, directions, variants)
come from the preset, and any setting given by a flag or a config file overrides the model's.

Layers that alternate (Gemma 2's and gpt-oss's sliding-window and global layers) are two masks of
one sweep.  A model may give a decode form: the settings ``--preset decode`` takes instead
(DeepSeek-V3 decodes with the absorbed form of multi-head latent attention: every query head
against one latent KV head of 576 dims, read back as 512)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.errors import UsageError


@dataclass(frozen=True)
class Model:
    name: str
    heads: int
    kv_heads: int
    head_dims: str  # as --head-dims spells it: 128, or 192/128
    masks: tuple[str, ...]
    source: str
    dtype: str = "bfloat16"
    note: str = ""
    decode: dict = field(default_factory=dict)  # settings that replace these under --preset decode
    ffn: str = ""  # its layers' feed-forward network for a layer scope (--scope): swiglu:INTERMEDIATE_SIZE

    def settings(self, preset: str) -> dict:
        """The sweep settings this model sets under ``preset`` (parsed values, as a preset's)."""
        out = {"heads": [self.heads], "kv_heads": [self.kv_heads], "head_dims": [_dims(self.head_dims)],
               "masks": list(self.masks), "dtypes": [self.dtype]}
        if self.ffn:
            out["ffn"] = self.ffn
        if preset == "decode" and self.decode:
            out |= {k: [_dims(v)] if k == "head_dims" else [v] for k, v in self.decode.items()}
        return out

    def summary(self, spec) -> str:
        """One line naming the model and the shapes ``spec`` (a sweep of it) takes, each one a
        flag overrode marked with the model's own."""
        own = self.settings(spec.preset)

        def part(key, words):
            got = ",".join(map(str, getattr(spec, key) or []))
            mine = ",".join(map(str, own[key]))
            return f"{words} {got}" + (f" (the model's: {mine})" if got != mine else "")
        return (f"model {self.name}: " + "; ".join([part("heads", "query heads"), part("kv_heads", "KV heads"),
                                                     part("head_dims", "head dims"), part("masks", "masks"),
                                                     part("dtypes", "dtype")]) + f" (from {self.source})")

    def row(self) -> dict:
        """One line of ``list --models``."""
        layers = " | ".join(self.masks)
        decode = ", ".join(f"{k}={v}" for k, v in self.decode.items())
        return {"model": self.name, "heads": self.heads, "kv_heads": self.kv_heads, "head_dims": self.head_dims,
                "layers (masks)": layers, "dtype": self.dtype, "ffn": self.ffn or "-",
                "decode form": decode or "-", "source": self.source}


def _dims(text: str):
    return int(text) if "/" not in str(text) else str(text)


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("llama3-8b", 32, 8, "128", ("causal",), "huggingface.co/meta-llama/Meta-Llama-3-8B, config.json "
          "(intermediate_size 14336)", ffn="swiglu:14336"),
    Model("llama3-70b", 64, 8, "128", ("causal",), "huggingface.co/meta-llama/Meta-Llama-3-70B, config.json "
          "(intermediate_size 28672)", ffn="swiglu:28672"),
    Model("mistral-7b", 32, 8, "128", ("window:4096",),
          "huggingface.co/mistralai/Mistral-7B-v0.1, config.json (sliding_window 4096)",
          note="v0.1: every layer a sliding window of 4096", ffn="swiglu:14336"),
    Model("gemma2-9b", 16, 8, "256", ("window:4096+softcap:50", "causal+softcap:50"),
          "huggingface.co/google/gemma-2-9b, config.json (attn_logit_softcapping 50, sliding_window 4096)",
          note="layers alternate a sliding window of 4096 and global attention, logits soft-capped at 50"),
    Model("qwen2.5-7b", 28, 4, "128", ("causal",), "huggingface.co/Qwen/Qwen2.5-7B, config.json "
          "(intermediate_size 18944)", ffn="swiglu:18944"),
    Model("gpt-oss-20b", 64, 8, "64", ("window:128+learned_sink", "causal+learned_sink"),
          "huggingface.co/openai/gpt-oss-20b, config.json (sliding_window 128, learned sinks per head)",
          note="layers alternate a sliding window of 128 and global attention, each head with a learned sink "
               "(the sinks' values here are seeded, not the trained ones)"),
    Model("deepseek-v3", 128, 128, "192/128", ("causal",),
          "huggingface.co/deepseek-ai/DeepSeek-V3, config.json (qk_nope 128 + qk_rope 64, v_head_dim 128, "
          "kv_lora_rank 512)",
          note="multi-head latent attention: prefill at 192/128; decode in the absorbed form, one latent KV head "
               "of 512 + 64 rope dims (576/512) for all 128 query heads (the scale here is 1/sqrt(576); "
               "DeepSeek's is 1/sqrt(192): the time does not depend on it)",
          decode={"kv_heads": 1, "head_dims": "576/512"}),
)}


def model(name: str) -> Model:
    """The model called ``name``, or a UsageError naming the valid ones."""
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; valid: {', '.join(MODELS)} (python -m bench list --models)")
    return MODELS[name]
