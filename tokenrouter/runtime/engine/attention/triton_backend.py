"""`TritonAttnBackend`: paged attention with the Triton kernels of `triton_kernels.py` (CUDA only).

Its per-step metadata is two host integers (the grid bound `max_extend_len` and the KV split count); the
kernels read everything else (`req_pool_indices`, `seq_lens`, `qo_indptr`, `extend_seq_lens`, the page
table) from the batch's device tensors. So a forward captured in a CUDA graph with static batch tensors
replays correctly for any sequence lengths: the graph runner only refills those tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenrouter.runtime.engine.attention import tuned_tiles
from tokenrouter.runtime.engine.attention.base import AttentionBackend, AttentionConfig
from tokenrouter.runtime.engine.compile_ahead import layers_to_build
from tokenrouter.runtime.engine.config import EngineTuning
from tokenrouter.runtime.engine.forward_batch import ForwardBatch
from tokenrouter.runtime.engine.kernels import attention as ka
from tokenrouter.runtime.engine.kernels import attention_shapes as ks
from tokenrouter.runtime.engine.kernels import dot_rows as kd
from tokenrouter.runtime.engine.kernels import elementwise as ke
from tokenrouter.runtime.engine.kernels import linear as kl
from tokenrouter.runtime.engine.kernels.common import cdiv

DEFAULT_TUNING = EngineTuning()
GEMV_ROWS_MAX = (
    DEFAULT_TUNING.gemv_rows_max
)  # the default `gemv_rows_max`: the most tokens a step may have to use `gemv_rows`. On
# the H200, with `dot_prefetch`, `dot_rows` took the 0.6B's 3-4 token steps in 0.93-0.96x the time
# of `gemv_rows` (bs 1 x 4 extends and bs 4 decodes, ctx 512 and 4096), so those run on `dot_rows` (2-token
# steps were not timed against it and stay here)
# the default `gemv_rows_batch_max`: the most requests such a step may hold. 2, i.e. any step of 2 tokens:
# the kernel's cost depends on the rows, not on which request they belong to, so a decode of 2 rows gains
# what the 2-token extends gained; timed end to end on the 0.6B as engine_bench's "no gemv_rows" ablation
# rows at decode bs 2-4.
GEMV_ROWS_BATCH_MAX = DEFAULT_TUNING.gemv_rows_batch_max
# the default `small_hidden_max`: `gemv_rows` and `gemv_norm` act on models of at most this hidden size only.
# On the H200: at the 0.6B (hidden 1024) the few-row GEMV makes a bs-1 extend
# of 2 tokens 0.89 ms against 1.37 with cuBLAS and of 4 tokens 1.19 against 1.37 (8 tokens: slower than
# cuBLAS), and the folded add & RMSNorm saves 1 %; at the 8B (hidden 4096) the few-row GEMV makes a
# 4-token extend 41 % slower than cuBLAS and the folded norm costs 5-6 % of a decode step (each GEMV
# program recomputes the 4096-wide norm), so large models run both unfolded and on cuBLAS.
SMALL_HIDDEN_MAX = 2048
# the default `dot_rows_max`: steps of up to this many tokens on a small model that neither GEMV takes run
# their linear layers as `dot_rows` (tensor cores; kd.DOT_ROWS_LIMIT at most). On the H200
# every 0.6B step of up to 16 tokens was 1.7-11.8 % faster than with cuBLAS (bs-1 extend of 8 tokens:
# 1.150 vs 1.286 ms). Steps of 17-32 tokens run a 32-row block (BLOCK_X 32), which beats cuBLAS only with tiles
# tuned in the graph: with the autotuner's picks 1.12-1.21x slower, with tiles tuned in the graph the extends of
# 4 x 8 and 16 x 2 tokens 0.92x / 0.98x as long as on cuBLAS (ctx 512 and 4096). So the default reach is
# DOT_ROWS_MAX where the tuned tables have 32-row tiles for the GPU model and dtype, else 16 (`DOT_ROWS_NARROW_MAX`).
DOT_ROWS_MAX = 32
DOT_ROWS_NARROW_MAX = 16  # the 16-row block's reach
# the default `dot_rows_decode_max`: decodes (one new token per row) of more rows than this run on cuBLAS. On the
# H200 the 32-row block at decode bs 32 was slower than cuBLAS (1.08x at ctx 512, 1.16x at 4096).
DOT_ROWS_DECODE_MAX = DEFAULT_TUNING.dot_rows_decode_max

# Which attention launches run their KV loop unpipelined (`attn_stages`: 1 stage; the others take 2, or 3 in 32-row
# blocks) and read their first tile before the PDL wait (`attn_prefetch`): decodes of one request only. The earlier
# rule (every block of up to ks.SINGLE_STAGE_ROWS (8) query rows unpipelined, from a sweep at bs 16, ctx 4096 before
# PDL; every decode reading early) lost to it. 0.6B on the H200, side by side in the engine's steps, against that
# rule: extends with 8-row blocks pipelined take 0.70x the time at bs 16 x 2 and x 4, ctx 4096, 0.90x at 512 (bs 1
# and 4: 0.87-0.99x, but bs 4 x 2 / x 4 at 512 1.006 / 1.011x); decodes pipelined without the early reads 0.53-0.79x
# at bs 8-64, ctx 4096, 0.71-0.98x at 512, 0.89x / 1.02x at bs 4, and 1.008x / 1.032x at bs 1 (ctx 4096 / 512),
# where pipelined with the early reads they had gained 1-4 % at bs 32-64 only. The 8B's decodes (4 query rows per
# block instead of 2, the same grid) gained as much: 0.93x / 0.73x at bs 32, ctx 512 / 4096, against the old rule.
# Decodes of bs 2 pipelined without early reads took 0.908x at ctx 4096, 1.003x at 512; so only bs 1 keeps them
# (there they pay: the step's one busy tile per program is read during the kernel before).
ATTN_DECODE_SINGLE_STAGE_BS = 1
ATTN_EXTEND_SINGLE_STAGE_ROWS = 0

# The attention's KV tile (BLOCK_N tokens per loop iteration; the kernel's own is 64). On the H200 a sweep of tile x
# stages x warps for the kernel alone at the engine's launch options, bs 1-64, ctx 512 and 4096, both geometries: at
# 1-8 KV splits (bs >= 4 at 8 KV heads) 128-token tiles with 2 stages took 0.74-0.96x the kernel time of the
# 64-token tile (bs 16 x 8, ctx 4096: 94.5 -> 70.0 us, 3.8 TB/s of KV), except where the grid has more than
# ATTN_WIDE_TILE_WAVES programs per SM (its two stages take 128 KB of shared memory: one program per SM; bs 64
# 1.01-1.05x). In the engine's steps (side by side) the 0.6B's bs 8-32 steps gained up to 1.30x at ctx 4096 (bs 16 x
# 8: 4.06 -> 3.13 ms) and 1.00-1.08x at 512 (decode bs 8: 0.990x), the 8B's up to 1.20x; but at bs 4 (8 splits), ctx
# 512, the steps lost (decode 0.989x, extend 4 x 8 0.914x: 1.28 -> 1.40 ms) while gaining 1.04-1.10x at 4096. A
# graph is captured per batch shape, for any context, so one tile serves both: bs 4 keeps the 64-token tile
# (ATTN_WIDE_TILE_SPLITS 4; its 8B steps gained 1.5-3.8 % at 4096 only). Launches of at least
# ATTN_NARROW_TILE_SPLITS splits (one request) that do not read early run 32-token tiles, 2 stages: at ctx 512 a
# split's range is 16 tokens, and 32-token chunks keep twice the programs busy (bs 1 extends 1.02-1.04x faster at
# 512, 1.00-1.03x at 4096, in the engine's steps). Decodes that read early keep the kernel's tile (64 tokens), as
# does what was not swept: head dims over 128, row blocks of more than 32 query rows (extends of more than 16 tokens
# at GQA 2, 8 at GQA 4; prefills).
ATTN_WIDE_TILE_SPLITS = 4
ATTN_WIDE_TILE_WAVES = 2
ATTN_NARROW_TILE_SPLITS = 32

# The fast path's switchable parts (backend attributes of these names, all on by default): for side-by-side
# timing a benchmark sets the attribute and captures the graphs again (bench/engine_bench.py's ablation).
FAST_PATH_OPTIONS = {
    "fused_ops": "the decoder runs `fused_decoder_forward` (off: the model's plain forward)",
    "gemv": "one-token steps run their linear layers as the Triton GEMV (off: cuBLAS)",
    "gemv_norm": "one-token steps (and gemv_rows steps, and dot_rows steps of up to `dot_rows_norm_max` tokens) "
    "fold add & RMSNorm into the next linear kernel's prologue, on models of hidden size <= `small_hidden_max` "
    "(default 2048) (off: an rmsnorm launch)",
    "gemv_rows": f"steps of 2 to `gemv_rows_max` tokens (default {GEMV_ROWS_MAX}) of at most "
    f"`gemv_rows_batch_max` requests (default {GEMV_ROWS_BATCH_MAX}), on models of hidden size <= "
    f"`small_hidden_max` (default {SMALL_HIDDEN_MAX}), run their linear layers as the few-row Triton GEMV "
    "`gemv_rows` (each weight read once for all rows) (off: cuBLAS)",
    "dot_rows": f"steps of up to `dot_rows_max` tokens (default {DOT_ROWS_MAX} where the tuned tables have "
    f"32-row tiles for the GPU, else {DOT_ROWS_NARROW_MAX}; decodes up to `dot_rows_decode_max` rows, default "
    f"{DOT_ROWS_DECODE_MAX}) that neither GEMV takes, on models of hidden size <= `small_hidden_max`, run their "
    "linear layers on tensor cores as `dot_rows` (the weight on the MMA's large side, split K for narrow layers) "
    "(off: cuBLAS)",
    "dot_prefetch": "with pdl, `dot_rows` reads its first weight tile before waiting on the previous kernel "
    "and tunes over tiles that hold a program's whole weight slice (one K tile per program), as the GEMV does; "
    "measured at 0.82-0.96x the step time of every 0.6B dot_rows step on the H200 (off: every read after the "
    "wait, over the general tile list)",
    "fused_merge": "split-KV attention merges its partials in the kernel (the last program of each row block, "
    "by an atomic ticket) (off: a second kernel, `_merge_splits_kernel`, per attention)",
    "attn_tiles": f"attention KV tiles of 128 tokens for launches of at most `attn_wide_tile_splits` KV splits "
    f"(default {ATTN_WIDE_TILE_SPLITS}) and {ATTN_WIDE_TILE_WAVES} programs per SM, of 32 tokens for launches of at "
    f"least `attn_narrow_tile_splits` (default {ATTN_NARROW_TILE_SPLITS}) that do not read early, 2 stages for "
    "both (off: the kernel's tile everywhere, 64 tokens at head_dim <= 128, and the stages below)",
    "attn_stages": "attention pipeline stages: 1 for decodes of up to `attn_decode_single_stage_bs` requests "
    f"(default {ATTN_DECODE_SINGLE_STAGE_BS}) and for extends of up to `attn_extend_single_stage_rows` query rows "
    f"per block (default {ATTN_EXTEND_SINGLE_STAGE_ROWS}: none), else 2 (3 for 32-row blocks) (off: 2 for all)",
    "attn_prefetch": "a decode of up to `attn_decode_single_stage_bs` requests (and an extend of up to "
    "`attn_prefetch_max` new tokens per request, default 1: none) reads its attention's first tile's page-table "
    "entries and older tokens' K/V before waiting on the previous kernel (with pdl; off: every read after the "
    "wait). On the H200, extends of 8 tokens were 1.3-3.7 % faster without it at ctx 512, and decodes of 4-64 "
    "requests 2-47 % faster without it, pipelined",
}

# A launch of more query rows than this (the longest extend's tokens x the GQA group) runs its KV range unsplit: its
# row blocks are taken to fill the GPU. That is not so at long contexts: on the H200, the 8B's steps whose longest
# extend was 17-64 tokens (68-256 rows at GQA 4) took twice as long as those of at most 16 at about 3,000 tokens of
# context (15-16.7 against 6.6-8.1 ms), a launch of 1-3 row blocks per KV head over 132 SMs. `choose_num_splits`
# decides up to ATTN_SPLIT_ROWS rows (it returns 1 where the row blocks fill the GPU anyway). 256: timed side by
# side in the engine's steps, the 8B's 17-64-token extends at ctx 3,200 took 0.50-0.78x the time of a 64-row rule
# (0.89-0.99x at ctx 512), no measured step lost, and a served load of such steps (closed N = 4, 3,072-token
# prompts) ran 1.07x faster in std-serving and 1.06x in TokenRouter. `EngineTuning.attn_split_rows` (64 to 65536)
# sets it.
ATTN_SPLIT_ROWS = DEFAULT_TUNING.attn_split_rows


# the rows per attention block whose split-KV partials the kernel merges itself (the fused merge); more rows merge
# in a second kernel. `EngineTuning.fused_merge_rows` (1-64; default 4): a profile counted 28 merge launches per
# bs-1 extend of 8 tokens (16 rows at GQA 2); 16 folds them, and was measured slower than the launch on the H200:
# 1.06-1.15x at bs 1, 1.01-1.06x at bs 4 and 16, with the tail merging 2 rows per pass. `fused_merge_passes` P also
# merges in the kernel every larger block whose partials it loads in at most P passes of as many rows as fit
# (`ks.fused_merge_rows`: a 16-row block with 8 splits in 2, with 2 splits in 1). Default P: 1 (on the H200,
# 0.94-0.98x the step time of the merge launch where a block takes one pass, 1.03-1.07x where it takes two); 0
# merges every larger block in the launch


@dataclass(slots=True)
class TritonMetadata:
    max_extend_len: int  # bounds every row's new tokens; sizes the kernel grid
    num_splits: int  # programs sharing one row block's KV range (flash-decoding)
    num_stages: int = 2  # the KV loop's pipeline stages (see ATTN_DECODE_SINGLE_STAGE_BS)
    prefetch: bool = False  # the first KV tile read before the PDL wait (attn_prefetch)
    block_n: int | None = None  # KV tokens per loop iteration (None: the kernel's; see ATTN_WIDE_TILE_SPLITS)
    tickets: torch.Tensor | None = None  # with splits: the fused merge's counters (zeros between launches)


class TritonAttnBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graph = True

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        if config.head_dim < 16:
            raise ValueError(f"the triton attention backend needs head_dim >= 16, got {config.head_dim}")
        tuning = config.tuning
        for name in FAST_PATH_OPTIONS:  # see FAST_PATH_OPTIONS
            setattr(self, name, True)
        self.tuned_tiles, self.pdl = tuning.tuned_tiles, tuning.pdl  # see EngineTuning
        self._init_attention_options(tuning)
        self._init_dot_rows(tuning)
        self.small_hidden_max: int | None = SMALL_HIDDEN_MAX
        # the fused ops need a power-of-two head_dim
        self.fused_ops = self.fused_ops and config.head_dim & (config.head_dim - 1) == 0
        self._rope_tables: dict[int, torch.Tensor] = {}
        # the fused split merge's tickets: one buffer for every launch (each leaves it zero); a smaller one
        # replaced by a larger stays alive, as graphs captured with it still use it
        self._tickets: list[torch.Tensor] = []
        # `launch_variant`'s q: heads, head size and dtype, no data
        self._shape_only_q = torch.empty(
            (0, config.num_heads, config.head_dim), dtype=config.dtype, device="meta"
        )

    def _init_attention_options(self, tuning: EngineTuning) -> None:
        """The GEMV, split merge and attention launch options (see EngineTuning and the constants)."""
        # with gemv_rows: steps of 2..gemv_rows_max tokens (at most kl.GEMV_ROWS_LIMIT) and at most
        # gemv_rows_batch_max requests use the few-row GEMV; it and gemv_norm act on models of hidden size
        # <= small_hidden_max only (see SMALL_HIDDEN_MAX; None: every model)
        self.gemv_rows_batch_max, self.gemv_rows_max = tuning.gemv_rows_batch_max, tuning.gemv_rows_max
        # with fused_merge: its rows per block, and the passes of a larger block that still merges in the kernel
        self.fused_merge_rows, self.fused_merge_passes = tuning.fused_merge_rows, tuning.fused_merge_passes
        # launches of more query rows than this run their KV range unsplit (see ATTN_SPLIT_ROWS)
        self.attn_split_rows = tuning.attn_split_rows
        # decodes of at most this many requests read their first KV tile early (attn_prefetch) and run the
        # attention's KV loop unpipelined (attn_stages), larger ones pipelined without early reads; extends
        # whose row blocks hold at most this many query rows run it unpipelined (see ATTN_DECODE_SINGLE_STAGE_BS)
        self.attn_decode_single_stage_bs = ATTN_DECODE_SINGLE_STAGE_BS
        self.attn_extend_single_stage_rows = ATTN_EXTEND_SINGLE_STAGE_ROWS
        # with attn_prefetch: extends of at most this many new tokens per request read early too (1: none)
        self.attn_prefetch_max = 1
        # with attn_tiles: the split counts that take 128-token KV tiles (at most) and 32-token ones (at least)
        self.attn_wide_tile_splits = ATTN_WIDE_TILE_SPLITS
        self.attn_narrow_tile_splits = ATTN_NARROW_TILE_SPLITS

    def _init_dot_rows(self, tuning: EngineTuning) -> None:
        """The tuned tile tables in use and the `dot_rows` step limits they allow."""
        tuned_tiles.use_files(tuning.tuned_tiles_files, kd.check_tile_config)  # a bad file is named here
        # with dot_rows: the most tokens of a `dot_rows` step, and of a decode one (see DOT_ROWS_MAX)
        wide = DOT_ROWS_MAX if self._tuned_for(BLOCK_X=32) else DOT_ROWS_NARROW_MAX
        self.dot_rows_max = wide if tuning.dot_rows_max is None else tuning.dot_rows_max
        self.dot_rows_decode_max = tuning.dot_rows_decode_max
        # with gemv_norm: dot_rows steps of up to this many tokens fold add & RMSNorm (measured: the fold as fast
        # as the rmsnorm launch only with tiles tuned in the graph for its keys):
        # each row block whose folded tiles the tuned tables hold for this GPU and model, from the 16-row one up
        self.dot_rows_norm_max = 0
        for block in (DOT_ROWS_NARROW_MAX, kd.DOT_ROWS_LIMIT):
            if not self._tuned_for(NORM=True, BLOCK_X=block):
                break
            self.dot_rows_norm_max = block

    def _tuned_for(self, **fields) -> bool:
        """Whether the tuned tables hold `dot_rows` tiles with these key fields for this GPU model, dtype and
        model (its q/k/v projection's shape stands for its layers; unknown without `hidden_size`)."""
        c = self.config
        if not self.tuned_tiles or c.hidden_size is None:
            return False
        qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        return tuned_tiles.covers("dot_rows", c.device, c.dtype, N=qkv, K=c.hidden_size, **fields)

    def options(self) -> dict[str, bool]:
        """The state of every switchable part (for benchmark records)."""
        return {name: getattr(self, name) for name in FAST_PATH_OPTIONS}

    def fused_forward(self, model, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's forward with fused element-wise ops (see `fused_decoder_forward`)."""
        return fused_decoder_forward(model, forward_batch)

    def rope_table(self, rotary) -> torch.Tensor:
        """[max_pos, head_dim] float32: cos of the first half-frequencies, then sin (built once)."""
        table = self._rope_tables.get(id(rotary))
        if table is None:
            half = rotary.head_dim // 2
            table = torch.cat([rotary.cos[:, :half], rotary.sin[:, :half]], dim=-1).float().contiguous()
            self._rope_tables[id(rotary)] = table
        return table

    def metadata_for(self, batch_size: int, max_extend_len: int) -> TritonMetadata:
        """The metadata for a launch shape; a graph runner calls this once per captured shape."""
        md = self._launch_shape(batch_size, max_extend_len)
        if md.num_splits > 1:
            md.tickets = self.tickets_for(batch_size, max_extend_len)
        return md

    def launch_variant(self, batch_size: int, max_extend_len: int) -> tuple:
        """What the attention of a step of `batch_size` rows, the longest of `max_extend_len` new tokens,
        compiles to (`ks.launch_variant`), with the batch size's parity (the alignment of the step's integer
        inputs, `ForwardBatch._device_parts`): two steps of one variant launch one compiled kernel. The eager
        warm-up runs one step of each (`EagerWarmUp`)."""
        md = self._launch_shape(batch_size, max_extend_len)
        opts = {k: v for k, v in self.launch_options(md).items() if k != "tickets"}
        fused = self.fused_merge and md.num_splits > 1
        variant = ks.launch_variant(
            self._shape_only_q, self.config.num_kv_heads, batch_size, max_extend_len, fused, **opts
        )
        return (*variant, batch_size % 2)

    def variant_steps(self, max_batch: int, longest: int) -> list[tuple[int, int]]:
        """(batch size, longest row) pairs whose launches take every `launch_variant` that steps of up to
        `max_batch` rows and rows of up to `longest` new tokens can. While a launch's query rows stay within
        `attn_split_rows`, its KV splits and KV tile follow its program count (batch size x KV heads x row
        blocks) up to two waves of programs over the SMs, and beyond that only the batch size's parity (and a
        decode's early reads): those batch sizes there. Past the threshold the variant follows the parity and
        whether the row-block count (64-row blocks) is a multiple of 16: batch sizes 1 and 2 at the first row
        past it and at the first of each such count."""
        cfg = self.config
        group = cfg.num_heads // cfg.num_kv_heads
        split_len = self.attn_split_rows // group
        waves = ATTN_WIDE_TILE_WAVES * ks.num_sms(cfg.device)

        def widest(n: int) -> int:  # past this batch size only the parity changes a launch of n-token rows
            blocks = cdiv(n * group, ks.row_block_size(n * group))
            return max(cdiv(waves, cfg.num_kv_heads * blocks), self.attn_decode_single_stage_bs) + 2

        block = ks.row_block_size(self.attn_split_rows + 1)
        beyond = [
            split_len + 1,
            *(block * (k - 1) // group + 1 for k in range(16, longest * group // block + 2, 16)),
        ]
        pairs = [
            (b, n)
            for n in range(1, min(split_len, longest) + 1)
            for b in range(1, min(max_batch, widest(n)) + 1)
        ]
        return pairs + [(b, n) for n in beyond if n <= longest for b in range(1, min(max_batch, 2) + 1)]

    def _launch_shape(self, batch_size: int, max_extend_len: int) -> TritonMetadata:
        """A launch shape's metadata without its tickets."""
        cfg = self.config
        rows = max_extend_len * (cfg.num_heads // cfg.num_kv_heads)
        block_m = ks.row_block_size(rows)
        # long extends / prefills (more rows than attn_split_rows): taken to fill the GPU without splitting
        splits = 1 if rows > self.attn_split_rows else self._splits(batch_size, rows, block_m)
        early, single = self._early_reads(batch_size, max_extend_len)
        prefetch = self.attn_prefetch and early
        stages = ks.attention_stages(rows, block_m, single) if self.attn_stages else 2
        block_n = None  # the kernel's own (64 tokens at head_dim <= 128)
        # the launches the KV-tile sweep covered: row blocks of up to 32 query rows, head_dim <= 128, no early reads
        if self.attn_tiles and rows <= 32 and cfg.head_dim <= 128 and not prefetch:
            block_n, stages = self._kv_tile(batch_size, splits, stages)
        return TritonMetadata(
            max_extend_len=max_extend_len,
            num_splits=splits,
            num_stages=stages,
            prefetch=prefetch,
            block_n=block_n,
        )

    def _early_reads(self, batch_size: int, max_extend_len: int) -> tuple[bool, int]:
        """(whether the launch may read its first KV tile early, the most query rows whose row blocks run
        the KV loop unpipelined)."""
        if max_extend_len == 1:  # a decode: early reads and one stage up to a batch size (shape only)
            early = batch_size <= self.attn_decode_single_stage_bs
            return early, ks.SINGLE_STAGE_ROWS if early else 0
        return max_extend_len <= self.attn_prefetch_max, self.attn_extend_single_stage_rows

    def _splits(self, batch_size: int, rows: int, block_m: int) -> int:
        cfg = self.config
        return ks.choose_num_splits(batch_size, cfg.num_kv_heads, -(-rows // block_m), cfg.device)

    def _kv_tile(self, batch_size: int, splits: int, stages: int) -> tuple[int | None, int]:
        """(KV tokens per tile, stages) of a swept launch: 128-token tiles for few splits whose programs fit
        in ATTN_WIDE_TILE_WAVES waves, 32-token ones for many splits, else the kernel's own tile."""
        cfg = self.config
        programs = batch_size * cfg.num_kv_heads * splits  # one row block per KV head
        fits = programs <= ATTN_WIDE_TILE_WAVES * ks.num_sms(cfg.device)
        if splits <= self.attn_wide_tile_splits and fits:
            return 128, 2
        if splits >= self.attn_narrow_tile_splits:
            return 32, 2
        return None, stages

    def tickets_for(self, batch_size: int, max_extend_len: int) -> torch.Tensor:
        """The fused merge's zeroed ticket buffer, large enough for a launch shape's row blocks."""
        cfg = self.config
        group = cfg.num_heads // cfg.num_kv_heads
        return self._tickets_for(ks.attention_tickets(batch_size, cfg.num_kv_heads, max_extend_len, group))

    def _tickets_for(self, n: int) -> torch.Tensor:
        """A zeroed int32 buffer of at least n tickets (allocated outside graph capture: the graph runner
        asks for every captured shape's metadata before capturing it)."""
        if not self._tickets or self._tickets[-1].numel() < n:
            self._tickets.append(torch.zeros(max(n, 1024), dtype=torch.int32, device=self.config.device))
        return self._tickets[-1]

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        if fb.req_to_token_pool is None or fb.token_to_kv_pool is None:
            raise ValueError("the triton backend needs a ForwardBatch with both pools set")
        fb.attn_metadata = self.metadata_for(fb.batch_size, fb.max_extend_len)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        fb = forward_batch
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer_id)
        ke.store_kv(k, v, fb.out_cache_loc, k_buf, v_buf)
        return self.attend(q, layer_id, fb)

    def attend(self, q: torch.Tensor, layer_id: int, forward_batch: ForwardBatch) -> torch.Tensor:
        """Attention only, for callers that stored this step's K/V themselves (the fused
        `qk_norm_rope_store` path)."""
        fb = forward_batch
        md: TritonMetadata = fb.attn_metadata
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer_id)
        if q.stride(2) != 1:
            q = q.contiguous()
        out = torch.empty_like(q)
        return ka.paged_attention(
            q,
            k_buf,
            v_buf,
            out,
            fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            fb.qo_indptr,
            fb.extend_seq_lens,
            max_extend_len=md.max_extend_len,
            sm_scale=self.config.scaling,
            pdl=self.pdl,
            **self.launch_options(md),
        )

    def launch_options(self, md: TritonMetadata) -> dict:
        """`ka.paged_attention`'s launch options for a step's metadata (a benchmark can launch the kernel
        alone with these)."""
        return dict(
            num_splits=md.num_splits,
            num_stages=md.num_stages,
            block_n=md.block_n,
            prefetch=md.prefetch,
            tickets=md.tickets if self.fused_merge else None,
            fused_rows=self.fused_merge_rows,
            merge_passes=self.fused_merge_passes,
        )


def fused_decoder_forward(model, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """`DecoderForCausalLM.forward` with the element-wise ops fused (same math, float32 inside each fused op):
    add+RMSNorm in one launch, q/k RMSNorm + rotary + the K/V store in one, SiLU*up in one. Per layer:
    4 GEMMs, 3 fused ops, attention (1-2 launches). A one-token step runs its GEMMs as the Triton GEMV, and
    (`gemv_rows`) a step of 2 to `gemv_rows_max` tokens as the few-row GEMV, with SiLU*up in the down
    projection's input load and (`gemv_norm`) each add+RMSNorm in the prologue of the GEMV after it: 4
    GEMVs, 1 fused op and attention per layer. (`dot_rows`) A step of up to `dot_rows_max` tokens (a decode:
    `dot_rows_decode_max`) that neither GEMV takes runs its GEMMs on tensor cores as `dot_rows`, with SiLU*up
    folded, and add+RMSNorm too in steps of up to `dot_rows_norm_max` tokens.
    Returns (last-position logits [B, V], hidden [B, H])."""
    backend: TritonAttnBackend = model.attn_backend
    m = model.model
    cfg = model.config
    eps = cfg.rms_norm_eps
    pool = fb.token_to_kv_pool
    cos_sin = backend.rope_table(m.rotary)
    tokens = fb.input_ids.shape[0]
    decode = tokens == fb.batch_size  # one new token per row
    one_row = backend.gemv and tokens == 1
    small_model = backend.small_hidden_max is None or cfg.hidden_size <= backend.small_hidden_max
    few_rows = (
        backend.gemv_rows
        and small_model
        and 2 <= tokens <= min(backend.gemv_rows_max, kl.GEMV_ROWS_LIMIT)
        and fb.batch_size <= backend.gemv_rows_batch_max
    )
    small = one_row or few_rows  # the linear layers run as a Triton GEMV, else as dot_rows, else cuBLAS
    reach = backend.dot_rows_decode_max if decode else backend.dot_rows_max
    dot = backend.dot_rows and small_model and not small and 2 <= tokens <= min(reach, kd.DOT_ROWS_LIMIT)
    # a Triton kernel for the linear layers, with SiLU*up and (if `fold`) add & RMSNorm in it
    fast = small or dot
    fold_dot = dot and tokens <= backend.dot_rows_norm_max
    fold = small_model and backend.gemv_norm and (small or fold_dot)
    pdl = backend.pdl  # programmatic dependent launch between the Triton kernels below

    def gemv(x: torch.Tensor, layer: torch.nn.Linear, **variant) -> torch.Tensor:
        if one_row:
            return kl.gemv(x, layer.weight, layer.bias, pdl=pdl, tuned=backend.tuned_tiles, **variant)
        if few_rows:
            return kl.gemv_rows(x, layer.weight, layer.bias, pdl=pdl, tuned=backend.tuned_tiles, **variant)
        return kd.dot_rows(
            x,
            layer.weight,
            layer.bias,
            pdl=pdl,
            prefetch=backend.dot_prefetch,
            tuned=backend.tuned_tiles,
            unroll_merge=True,
            **variant,
        )

    def linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return gemv(x, layer) if fast else layer(x)

    residual = m.embed_tokens(fb.input_ids)

    def normed_linear(delta: torch.Tensor | None, norm, layer: torch.nn.Linear) -> torch.Tensor:
        """linear(rmsnorm(residual += delta)); delta None: linear(rmsnorm(residual))."""
        nonlocal residual
        if not fold:
            if delta is None:
                return linear(ke.rmsnorm(residual, norm.weight, eps, pdl=pdl), layer)
            return linear(ke.rmsnorm(delta, norm.weight, eps, residual=residual, pdl=pdl), layer)
        if delta is None:
            return gemv(residual, layer, norm_weight=norm.weight, eps=eps)
        new = torch.empty_like(residual)  # the GEMV's other programs still read the old stream
        y = gemv(delta, layer, norm_weight=norm.weight, eps=eps, residual=residual, residual_out=new)
        residual = new
        return y

    d = None  # the last layer's MLP output, not yet added to the residual stream
    for layer in layers_to_build(m.layers):  # all of them, but in a build-only block
        attn = layer.self_attn
        k_buf, v_buf = pool.get_kv_buffer(attn.layer_id)
        q = ke.qk_norm_rope_store(
            normed_linear(d, layer.input_layernorm, attn.qkv_proj),
            fb.positions,
            cos_sin,
            k_buf,
            v_buf,
            fb.out_cache_loc,
            attn.num_heads,
            attn.num_kv_heads,
            attn.head_dim,
            attn.q_norm.weight if attn.q_norm is not None else None,
            attn.k_norm.weight if attn.k_norm is not None else None,
            eps,
            pdl=pdl,
        )
        o = linear(backend.attend(q, attn.layer_id, fb).view(q.shape[0], -1), attn.o_proj)
        gate_up = normed_linear(o, layer.post_attention_layernorm, layer.mlp.gate_up_proj)
        down = layer.mlp.down_proj
        if fast:  # SiLU(gate) * up fused into the kernel's input load
            d = gemv(gate_up, down, silu_mul=True)
        else:
            d = down(ke.silu_and_mul(gate_up, pdl=pdl))
    if fb.num_tokens == fb.batch_size:
        # one token per row (decode): the last token of row b is token b
        last = ke.rmsnorm(d, m.norm.weight, eps, residual=residual, pdl=pdl)
    else:  # the last tokens only, by index
        last = ke.rmsnorm(d, m.norm.weight, eps, residual=residual, pdl=pdl, rows=fb.last_indices)
    return model.logits(last), last
