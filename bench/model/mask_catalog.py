"""The built-in masks and score mods, after attention-gym's catalogue.

Each is one predicate (see ``bench.model.masks`` for the form and the spelling), plus, for
masks, the key ranges each query row keeps, from which the pairs are counted exactly in
bounded memory; ``tests/model/test_masks.py`` checks those ranges against the predicate pair by
pair.  A predicate sees positions: query i at i + offset (0 top-left; kv_len - q_len bottom-right).
"""

from __future__ import annotations

import math

import torch

from bench.model.case import MAX_LEN, Case
from bench.model.maskdefs import mask, score_mod, sink_logit

# every parameter has both ends: positions and sizes up to the longest sequence a case may have;
# a count that becomes one key range or table row per unit (dilated's window, bigbird's random
# blocks) and the relative-bias table far shorter, so that no spelling allocates without bound
MAX_SEED = 2**31 - 1
MAX_SPANS = 4096
MAX_DISTANCE = 65536

# -- the four original masks -----------------------------------------------------------------


@mask("none", description="every query sees every key", intervals=lambda q, case: [(0, case.kv_len)])
def none(b, h, q_idx, kv_idx):
    return kv_idx >= 0


@mask("causal", description="key j <= query i (top-left aligned)", intervals=lambda q, case: [(0, q + 1)])
def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


@mask("window", params={"window": 256}, ranges={"window": f"1..{MAX_LEN}"},
      description="causal sliding window of `window` keys including the query's own: i - window < j <= i",
      intervals=lambda q, case, window: [(q - window + 1, q + 1)])
def window(b, h, q_idx, kv_idx, window):
    return (kv_idx <= q_idx) & (q_idx - kv_idx < window)


def padding_lengths(case: Case) -> dict:
    b2 = 2 * case.batch
    return {"lens": torch.tensor([case.kv_len - ((b + 1) * case.kv_len) // b2 for b in range(case.batch)])}


@mask("padding", prepare=padding_lengths,
      description="batch element b has kv_len - ((b+1) * kv_len) // (2 * batch) valid keys: from nearly "
                  "kv_len down to about kv_len / 2",
      intervals=lambda q, case, lens: [(0, lens.view(-1, 1))])
def padding(b, h, q_idx, kv_idx, lens):
    return kv_idx < lens[b]


# -- packed documents ---------------------------------------------------------------------------


def _documents(case: Case, docs: int, causal: int, seed: int, lengths: tuple, window: int) -> dict:
    n = max(case.q_len, case.kv_len)
    if lengths:
        if any(x < 1 for x in lengths):
            raise ValueError("document lengths must be positive")
        sizes = list(lengths)
        if sum(sizes) != n:  # as --lengths: the documents are the positions, every one, exactly
            raise ValueError(f"document:lengths={'/'.join(map(str, lengths))} sums to {sum(sizes)}, but the case "
                             f"has {n} positions (max of q_len and kv_len): the lengths must sum to exactly {n}")
    else:
        if not 1 <= docs <= n:
            raise ValueError(f"document:docs={docs} needs 1 <= docs <= {n} (the longer of q_len and kv_len)")
        g = torch.Generator().manual_seed(seed)
        cuts = sorted((torch.randperm(n - 1, generator=g)[:docs - 1] + 1).tolist())
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    ends = torch.tensor(sizes).cumsum(0)
    starts = ends - torch.tensor(sizes)
    doc = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))[:n]
    return {"doc": doc, "starts": starts, "ends": ends}


def _document_intervals(q, case, docs, causal, seed, lengths, window, doc, starts, ends):
    d = doc[q]
    hi = torch.minimum(ends[d], q + 1) if causal or window else ends[d]
    lo = torch.maximum(starts[d], q - window + 1) if window else starts[d]
    return [(lo, hi)]


@mask("document", params={"docs": 4, "causal": 0, "seed": 0, "lengths": (), "window": 0}, prepare=_documents,
      ranges={"docs": f"1..{MAX_LEN}", "causal": "0..1", "seed": f"0..{MAX_SEED}", "lengths": f"1..{MAX_LEN}",
              "window": f"0..{MAX_LEN}"},
      intervals=_document_intervals,
      description="packed sequences, block-diagonal: a token sees only tokens of its own document. `docs` "
                  "documents of seeded random lengths over max(q_len, kv_len) positions, or explicit "
                  "`lengths=a/b/c` summing to exactly that; causal=1 adds j <= i; "
                  "window=W a causal sliding window within each document, i - W < j <= i")
def document(b, h, q_idx, kv_idx, docs, causal, seed, lengths, window, doc, starts, ends):
    return _within(doc[q_idx] == doc[kv_idx], q_idx, kv_idx, causal, window)


def _within(same, pos, kv_idx, causal, window):
    """The keys of a query's own block (``same``), up to its position ``pos`` when causal, and
    within ``window`` of it when windowed."""
    if window:
        return same & (kv_idx <= pos) & (pos - kv_idx < window)
    return same & (kv_idx <= pos) if causal else same


def _varlen(case: Case, runs: tuple, causal: int, window: int) -> dict:
    if not runs or len(runs) % 3:
        raise ValueError("varlen:runs takes COUNT/Q/KV triples, e.g. runs=2/512/512/8/1/2048")
    triples = [runs[i:i + 3] for i in range(0, len(runs), 3)]
    if any(n < 1 or q < 1 or q > kv for n, q, kv in triples):
        raise ValueError("varlen:runs needs COUNT >= 1 and 1 <= Q <= KV in every triple")
    seqs = [(q, kv) for n, q, kv in triples for _ in range(n)]
    total_q, total_kv = sum(q for q, _ in seqs), sum(kv for _, kv in seqs)
    if (total_q, total_kv) != (case.q_len, case.kv_len):
        raise ValueError(f"varlen:runs holds {total_q} query and {total_kv} key tokens, but the case has "
                         f"q_len {case.q_len} and kv_len {case.kv_len}")
    ql, kl = torch.tensor([q for q, _ in seqs]), torch.tensor([kv for _, kv in seqs])
    kv_ends = kl.cumsum(0)
    kv_starts = kv_ends - kl
    q_seq = torch.repeat_interleave(torch.arange(len(seqs)), ql)
    kv_seq = torch.repeat_interleave(torch.arange(len(seqs)), kl)
    # each query's own position, as a packed key index: the last q tokens of its sequence (bottom-right)
    q_first = torch.repeat_interleave(kv_ends - ql, ql)
    q_pos = q_first + torch.arange(total_q) - torch.repeat_interleave(ql.cumsum(0) - ql, ql)
    return {"q_seq": q_seq, "kv_seq": kv_seq, "q_pos": q_pos, "kv_starts": kv_starts, "kv_ends": kv_ends}


def _varlen_intervals(q, case, runs, causal, window, q_seq, kv_seq, q_pos, kv_starts, kv_ends):
    s, pos = q_seq[q], q_pos[q]
    hi = pos + 1 if causal or window else kv_ends[s]
    lo = torch.maximum(kv_starts[s], pos - window + 1) if window else kv_starts[s]
    return [(lo, hi)]


@mask("varlen", params={"runs": (), "causal": 0, "window": 0}, prepare=_varlen, intervals=_varlen_intervals,
      ranges={"runs": f"1..{MAX_LEN}", "causal": "0..1", "window": f"0..{MAX_LEN}"},
      description="a mixed serving batch packed (what --batch-mix builds): runs=COUNT/Q/KV/... sequences of Q "
                  "queries and KV keys each, q and k packed apart; a query sees only its own sequence's keys, "
                  "aligned bottom-right within it (its queries are its last Q tokens); causal=1 adds j <= its "
                  "position, window=W a causal sliding window")
def varlen(b, h, q_idx, kv_idx, runs, causal, window, q_seq, kv_seq, q_pos, kv_starts, kv_ends):
    return _within(q_seq[q_idx] == kv_seq[kv_idx], q_pos[q_idx], kv_idx, causal, window)


# -- causal variations -------------------------------------------------------------------------


@mask("prefix_lm", params={"prefix": 256}, ranges={"prefix": f"0..{MAX_LEN}"},
      description="prefix LM: the first `prefix` keys are seen by every query (bidirectional prefix), the "
                  "rest causally",
      intervals=lambda q, case, prefix: [(0, torch.clamp(q + 1, min=prefix))])
def prefix_lm(b, h, q_idx, kv_idx, prefix):
    return (kv_idx <= q_idx) | (kv_idx < prefix)


@mask("chunked_causal", params={"chunk": 128}, ranges={"chunk": f"1..{MAX_LEN}"},
      description="causal inside fixed chunks of `chunk` tokens (Llama 4's local-attention layers)",
      intervals=lambda q, case, chunk: [(q // chunk * chunk, q + 1)])
def chunked_causal(b, h, q_idx, kv_idx, chunk):
    return (q_idx // chunk == kv_idx // chunk) & (kv_idx <= q_idx)


def _dilated_intervals(q, case, dilation, window):
    return [(q - m * dilation, q - m * dilation + 1) for m in range(window)]


@mask("dilated", params={"dilation": 2, "window": 64}, intervals=_dilated_intervals,
      ranges={"dilation": f"1..{MAX_LEN}", "window": f"1..{MAX_SPANS}"},
      description="dilated (strided) causal window: `window` keys spaced `dilation` apart, j = i - m * dilation "
                  "for m = 0 .. window-1 (Longformer's dilated sliding window)")
def dilated(b, h, q_idx, kv_idx, dilation, window):
    d = q_idx - kv_idx
    return (d >= 0) & (d % dilation == 0) & (d < window * dilation)


@mask("sink", params={"sinks": 4, "window": 0}, ranges={"sinks": f"0..{MAX_LEN}", "window": f"0..{MAX_LEN}"},
      description="attention sinks: the first `sinks` keys, causally, plus a causal window of `window` keys; "
                  "StreamingLLM is sink:4+window:256 (the same as sink:4:window=256)",
      intervals=lambda q, case, sinks, window: [(0, torch.clamp(q + 1, max=sinks)), (q - window + 1, q + 1)])
def sink(b, h, q_idx, kv_idx, sinks, window):
    return (kv_idx <= q_idx) & ((kv_idx < sinks) | (q_idx - kv_idx < window))


@mask("gym_window", params={"window": 256}, ranges={"window": f"0..{MAX_LEN}"},
      description="attention-gym's sliding window: causal and q - kv <= window, so window + 1 keys including the "
                  "query's own (gym_window:W is window:W+1)",
      intervals=lambda q, case, window: [(q - window, q + 1)])
def gym_window(b, h, q_idx, kv_idx, window):
    return (kv_idx <= q_idx) & (q_idx - kv_idx <= window)


def _gym_dilated_bound(case: Case, dilation: int, window: int) -> dict:
    if dilation > 1 and window // dilation > MAX_SPANS:
        raise ValueError(f"gym_dilated keeps 2 * (window // dilation) + 1 keys a query: window // dilation "
                         f"takes up to {MAX_SPANS:,}, got {window // dilation:,}")
    return {}


def _gym_dilated_intervals(q, case, dilation, window):
    if dilation == 1:
        return [(q - window, q + window + 1)]
    reach = window // dilation
    return [(q + m * dilation, q + m * dilation + 1) for m in range(-reach, reach + 1)]


@mask("gym_dilated", params={"dilation": 2, "window": 64}, prepare=_gym_dilated_bound,
      ranges={"dilation": f"1..{MAX_LEN}", "window": f"0..{MAX_LEN}"}, intervals=_gym_dilated_intervals,
      description="attention-gym's dilated sliding window: two-sided, |i - j| <= window and |i - j| % dilation == 0 "
                  "(window is a distance); its causal half is dilated:D:window=W//D+1")
def gym_dilated(b, h, q_idx, kv_idx, dilation, window):
    d = (q_idx - kv_idx).abs()
    return (d <= window) & (d % dilation == 0)


# -- speculative-decoding trees -------------------------------------------------------------------
# A draft tree of T tokens verified in one call: the queries are the tree's tokens, in the order
# given (a parent before its children), at positions offset .. offset + T - 1 (so with
# --align bottom-right the last T keys).  Each sees every key before the tree (the cache), its
# ancestors in the tree and itself, nothing else: not a sibling, not a cousin, not a later token.

MAX_TREE = 1024  # draft tokens verified in one call: hundreds at most in practice


def tree_shape(kind: str, tokens: int, width: int = 1) -> tuple[int, ...]:
    """The parent list (-1 for a token whose parent is the last token of the cache) of the
    catalogue's tree shapes over ``tokens`` tokens, breadth-first: ``chain`` (each token the
    child of the one before), ``branch`` (a complete ``width``-ary tree, breadth-first: a binary
    tree of depth 3 is 7 tokens), ``topk`` (levels of ``width`` candidates, each level's
    the children of the previous level's first, most likely one: a top-k tree of width x depth)."""
    if kind == "chain":
        return tuple(range(-1, tokens - 1))
    if kind == "branch":
        return tuple((i - 1) // width if i else -1 for i in range(tokens))
    if kind == "topk":
        return tuple(-1 if i < width else (i // width - 1) * width for i in range(tokens))
    raise ValueError(f"tree shape {kind!r}: chain, branch or topk")


def _tree(case: Case, parents: tuple) -> dict:
    """The tree's ancestor table: ``anc[i, j]`` true when token j is token i or one of its
    ancestors, and ``path[i]`` those tokens, i first, padded with -1 (the key ranges a row keeps)."""
    t = len(parents)
    if t != case.q_len:
        raise ValueError(f"a tree of {t} tokens (parents={'/'.join(map(str, parents)) or 'none'}) verifies "
                         f"{t} queries; this case has q_len {case.q_len}: give one parent per query, or use "
                         f"tree_chain, tree_binary or tree_topk, which take their size from q_len")
    if t > MAX_TREE:
        raise ValueError(f"a tree of {t} tokens: at most {MAX_TREE} draft tokens (q_len <= {MAX_TREE})")
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}]={p}: a token's parent comes before it (-1 <= parent < {i}; -1 is "
                             f"the last token of the cache)")
    anc = torch.eye(t, dtype=torch.bool)
    depth = [1] * t
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    path = torch.full((t, max(depth)), -1, dtype=torch.long)
    for i in range(t):
        chain = anc[i].nonzero().flatten().flip(0)  # i first, then its ancestors up to the root
        path[i, :len(chain)] = chain
    return {"anc": anc, "path": path, "base": case.offset}


def _tree_intervals(q, case, anc, path, base, **_):
    node = (q - base).clamp(0, path.shape[0] - 1)
    spans = [(0, torch.minimum(q + 1, torch.tensor(base)))]  # the cache
    for level in range(path.shape[1]):
        a = path[node, level]
        spans.append((torch.where(a >= 0, base + a, 0), torch.where(a >= 0, base + a + 1, 0)))
    return spans


def _tree_keep(b, h, q_idx, kv_idx, anc, base, **_):
    """The one predicate of every tree mask (their parameters only shape ``anc``)."""
    t = anc.shape[0]
    qn, kn = q_idx - base, kv_idx - base
    in_tree = (qn >= 0) & (qn < t) & (kn >= 0) & (kn < t)
    seen = anc[qn.clamp(0, t - 1), kn.clamp(0, t - 1)]
    return torch.where(kn >= 0, in_tree & seen, kv_idx <= q_idx)


def _tree_of(kind):
    def prepare(case: Case, **kw) -> dict:
        if kind == "topk" and kw.get("width", 2) > case.q_len:  # it would run as width q_len, labelled otherwise
            raise ValueError(f"tree_topk:{kw['width']} puts {kw['width']} candidates in a level, more than the "
                             f"{case.q_len} queries: give a width of at most q_len")
        return _tree(case, tree_shape(kind, case.q_len, kw.get("width", 2)))
    return prepare


mask("tree", params={"parents": ()}, ranges={"parents": f"-1..{MAX_TREE - 1}"},
     prepare=lambda case, parents: _tree(case, parents), intervals=_tree_intervals,
     description="speculative-decoding tree verification: the queries are a draft tree's tokens, "
                 "parents=p0/p1/... one per query (-1: the last token of the cache; a parent before its "
                 "children); each sees the cache, its ancestors and itself (use with --align bottom-right)")(_tree_keep)
mask("tree_chain", prepare=_tree_of("chain"), intervals=_tree_intervals,
     description="a draft chain of q_len tokens (tree with parents -1/0/1/...): bottom-right causal, "
                 "counted as a tree")(_tree_keep)
mask("tree_binary", prepare=_tree_of("branch"), intervals=_tree_intervals,
     description="a complete binary draft tree of q_len tokens, breadth-first (q_len 7: depth 3)")(_tree_keep)
mask("tree_topk", params={"width": 4}, ranges={"width": f"1..{MAX_TREE}"}, prepare=_tree_of("topk"),
     intervals=_tree_intervals,
     description="a top-k draft tree: q_len / width levels of `width` candidates, each level the children "
                 "of the previous level's first (width 4 at q_len 12: 4 x 3)")(_tree_keep)


# -- block sparse ----------------------------------------------------------------------------------


def _bigbird_blocks(case: Case, block: int, window: int, globals: int, random: int, seed: int) -> dict:
    if block < 1 or window < 0 or globals < 0 or random < 0:
        raise ValueError("bigbird takes block >= 1 and window, globals, random >= 0")
    # a row per block of query *positions*: bottom-right puts query i at kv_len - q_len + i, so the
    # positions reach kv_len - 1 however few the queries are
    nq = math.ceil(max(case.q_len + case.offset, case.q_len) / block)
    nk = math.ceil(case.kv_len / block)
    g = torch.Generator().manual_seed(seed)
    rand = torch.randint(0, nk, (nq, random), generator=g) if random else torch.zeros(nq, 0, dtype=torch.long)
    qb, kb = torch.arange(nq).view(-1, 1), torch.arange(nk).view(1, -1)
    table = ((qb - kb).abs() <= window) | (kb < globals) | (qb < globals)
    if random:
        table[torch.arange(nq).view(-1, 1).expand_as(rand), rand] = True
    return {"table": table, "rand": rand}


def _bigbird_intervals(q, case, block, window, globals, random, seed, table, rand):
    qb = q // block
    spans = [((qb - window) * block, (qb + window + 1) * block), (0, globals * block),
             (0, torch.where(qb < globals, case.kv_len, 0))]
    for r in range(rand.shape[1]):
        rb = rand[qb, r]
        spans.append((rb * block, (rb + 1) * block))
    return spans


@mask("bigbird", params={"block": 64, "window": 1, "globals": 1, "random": 2, "seed": 0},
      prepare=_bigbird_blocks, intervals=_bigbird_intervals,
      ranges={"block": f"1..{MAX_LEN}", "window": f"0..{MAX_LEN}", "globals": f"0..{MAX_LEN}",
              "random": f"0..{MAX_SPANS}", "seed": f"0..{MAX_SEED}"},
      description="BigBird block sparse, bidirectional, in blocks of `block` tokens: `window` blocks either side, "
                  "`globals` global blocks (seen by all and seeing all), `random` seeded random key blocks per "
                  "query block")
def bigbird(b, h, q_idx, kv_idx, block, window, globals, random, seed, table, rand):
    return table[q_idx // block, kv_idx // block]


# -- score mods ------------------------------------------------------------------------------------


def alibi_slopes(heads: int) -> list[float]:
    """Press et al. 2022: the geometric sequence 2^(-8/n), 2^(-16/n), ... for n a power of two;
    otherwise those of the closest power of two below, then every other slope of twice that."""
    def pow2(n):
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]
    if heads & (heads - 1) == 0:
        return pow2(heads)
    p = 1 << (heads.bit_length() - 1)
    return pow2(p) + pow2(2 * p)[0::2][:heads - p]


@score_mod("alibi", additive=True, prepare=lambda case: {"slopes": torch.tensor(alibi_slopes(case.heads))},
           description="ALiBi: score + slope_h * (j - i), one-sided (keys after the query gain): attention-gym's "
                       "form, and FlashAttention's under a causal mask; the paper's slopes per head (attention-gym's "
                       "generate_alibi_bias uses 2^(-8(h+1)/H) for every H: it differs when H is no power of two)")
def alibi(score, b, h, q_idx, kv_idx, slopes):
    return score + slopes[h] * (kv_idx - q_idx)


@score_mod("alibi_symmetric", additive=True,
           prepare=lambda case: {"slopes": torch.tensor(alibi_slopes(case.heads))},
           description="ALiBi by distance: score - slope_h * |i - j|, FlashAttention's alibi_slopes without a causal "
                       "mask (the same as alibi under one); the paper's slopes per head")
def alibi_symmetric(score, b, h, q_idx, kv_idx, slopes):
    return score - slopes[h] * (q_idx - kv_idx).abs()


@score_mod("softcap", params={"cap": 50.0}, ranges={"cap": "> 0..1e6"},
           description="tanh soft cap: cap * tanh(score / cap) (Gemma 2 uses 50 on attention logits)")
def softcap(score, b, h, q_idx, kv_idx, cap):
    return cap * torch.tanh(score / cap)


def _rel_table(case: Case, max_distance: int, seed: int) -> dict:
    if max_distance < 0:
        raise ValueError("rel_bias:max_distance must be >= 0")
    g = torch.Generator().manual_seed(seed)
    return {"table": 0.5 * torch.randn(case.heads, 2 * max_distance + 1, generator=g)}


@score_mod("rel_bias", params={"max_distance": 128, "seed": 0}, additive=True, prepare=_rel_table,
           ranges={"max_distance": f"0..{MAX_DISTANCE}", "seed": f"0..{MAX_SEED}"},
           description="relative position bias: score + table[h, clamp(j - i, -max_distance, max_distance)], a "
                       "seeded table (0.5 * N(0, 1)) per head, as a learned T5-style bias would be")
def rel_bias(score, b, h, q_idx, kv_idx, max_distance, seed, table):
    return score + table[h, torch.clamp(kv_idx - q_idx, -max_distance, max_distance) + max_distance]


def _sink_logits(case: Case, seed: int, mean: float) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"logits": mean + torch.randn(case.heads, generator=g, dtype=torch.float64)}


@sink_logit("learned_sink", params={"seed": 0, "mean": 0.0}, prepare=_sink_logits,
            ranges={"seed": f"0..{MAX_SEED}", "mean": "-30..30"},
            description="gpt-oss's learned attention sink: per head a virtual key with logit s_h (seeded, "
                        "mean + N(0, 1)) and a zero value, added to each row's softmax denominator: "
                        "out = softmax-weighted V x 1 / (1 + exp(s_h - lse))")
def learned_sink(h, seed, mean, logits):
    return logits[h]
