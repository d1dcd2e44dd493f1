"""The ``cpu_int4`` quantization method (W4A16) for vLLM on CPU.

Two ways in:

- a checkpoint written by ``omni-ray quantize`` (see :mod:`vllm_omni.quantization.convert`):
  config.json carries ``quantization_config = {"quant_method": "cpu_int4", "group_size": ...,
  "ignored_modules": [...], "row_threshold": ...}`` and each quantized layer has
  ``weight_packed`` / ``weight_scale`` / ``weight_zero`` (format in
  :mod:`vllm_omni.quantization.grid`);
- a bf16 checkpoint loaded with ``LLM(..., quantization="cpu_int4")``: no config file is read
  (``get_config_filenames()`` is empty), vLLM builds :class:`CpuInt4Config` with its defaults and
  every layer is quantized right after loading.

``cpu_int4_a8`` is the same method with ``activation_bits`` 8 (W4A8: x rounded to int8 per group
before the products, which the avx512 and avx2 kernels take four at a time; faster prefill, less
accurate): ``LLM(..., quantization="cpu_int4_a8")`` on a bf16 checkpoint or on a cpu_int4 one,
whose weights it reads as they are.

Either way each layer keeps one layout after loading: vllm_omni's int4 layout
(:mod:`vllm_omni.ops.int4_pack`, the same on every CPU) plus bf16 scales_and_zeros
[K/group, N, 2]; the checkpoint tensors are freed. The linear runs as the custom
op ``torch.ops.vllm_omni.cpu_int4_linear`` (:mod:`vllm_omni.ops.int4_linear`). The output head
is quantized too; a tied input embedding shares the head's packed tensors and dequantizes only
the rows it looks up.

The config and method classes are module-level: vLLM pickles the config to the engine process.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn import Parameter

from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import (
    UnquantizedEmbeddingMethod,
    VocabParallelEmbedding,
)
from vllm.model_executor.parameter import (
    GroupQuantScaleParameter,
    ModelWeightParameter,
    PackedvLLMParameter,
)

from vllm_omni.errors import OmniInputError
from vllm_omni.ops import int4_linear, int4_pack, weight_arena
from vllm_omni.quantization import grid

logger = logging.getLogger("vllm.omni")

QUANT_METHOD = "cpu_int4"
QUANT_METHOD_A8 = "cpu_int4_a8"
# Rows from which the op takes its many-row branch: with native kernels the int4 GEMM instead
# of the GEMV (the same bits, so speed only), with the Python ones dequantize + bf16 matmul
# instead of torch's int4 GEMM. The value was measured for the GEMV against dequantize +
# matmul, before the GEMM existed, with `python -m vllm_omni.ops.int4_bench --shapes 1152x896,
# 896x896,9728x896,896x4864,32000x896 --rows 1,2,4,8,12,16,24,32,64` (the qwen2.5-0.5b shapes, 2 threads, native
# kernels, idle 2-core AVX-512 VM): at 32 rows dequantize+matmul won on all 5 shapes (1.2x to
# 1.9x), at 24 on 4 (not the 32000-row head), at 16 on none. With torch's kernels the crossover was
# 128. Against the GEMM, throwaway runs on a loaded machine put the crossover between 8 and 32
# rows on these shapes, too noisy to move the value. Re-measure on the target machine
# (int4_bench compares the two branches) and write the value into the checkpoint's config.
DEFAULT_ROW_THRESHOLD = 32
# Kernel sets whose GEMM overtakes the GEMV at fewer rows. amx (its GEMM on AMX tiles): 16, from
# `python -m omni_ray.bench.int4_kernels --shape qwen2.5-3b-full-vocab --passes 3` on the Intel
# AMX Xeon (results/int4_kernels/20261207T113929Z.json): at 16 rows the GEMM took 0.68-0.80x
# the GEMV's time on all five 3B linears (head included), at 8 rows it lost on all five.
ROW_THRESHOLD_BY_SET = {"amx": 16}


# Rows from which W4A16 takes the bf16 product on the dequantized weights instead of the integer
# GEMM (vllm_omni/ops/int4_linear.py's dequant_mm; 0: never). Not the same bits: the GEMV's and
# the GEMM's integer arithmetic below it, a bf16 linear's rounding on the dequantized weights
# from it on. amx (int4_tile_mm, dequantizing straight into AMX bf16 tiles): 32, from `python -m
# omni_ray.bench.int4_prefill --shape qwen2.5-3b --rows 16,32,64,128,256 --reps 5` (2 threads,
# idle) on the Intel AMX Xeon (results/int4_prefill/20261207T2050Z-tile-mm/): at 32 rows a
# forward's linears took 0.89x the GEMM's time (gate-up, down and the head 0.82-0.93x, qkv and o
# 1.07-1.08x), at 64 rows and more 0.56-0.79x on all five, at 16 1.0-1.4x. (int4_dequant_mm,
# torch.mm per chunk of W^T, needed 512 rows to win.) avx512bf16 (int4_tile_mm on AVX512_BF16
# registers): 32, from the same command on the AMD EPYC Zen 5 (family 26, 2 threads, idle;
# results/int4_prefill/20261207T2315Z-avx512bf16/): at 32 rows a forward's linears took 0.95x
# the GEMM's time (o and qkv 1.01-1.04x, the others 0.86-0.98x), from 64 rows on 0.82-0.99x
# on all five, at 16 0.98x (qkv 1.33x).
# Other sets: never (their int4_dequant_mm is a torch.mm per chunk; on an AMD Zen 5 the avx512
# set's GEMM took 1.03-1.12x the time of the bf16 matmul alone at 512 rows, before any
# dequantizing: results/int4_prefill/20261206T025146Z.json).
DEQUANT_ROWS_BY_SET = {"amx": 32, "avx512bf16": 32}


def default_row_threshold() -> int:
    """row_threshold where a config gives none: measured per kernel set (the set this CPU runs),
    DEFAULT_ROW_THRESHOLD for the others. Speed only: both branches give the same bits."""
    from vllm_omni.ops import native

    return ROW_THRESHOLD_BY_SET.get(native.kernel_set(), DEFAULT_ROW_THRESHOLD)


def default_dequant_rows() -> int:
    """dequant_rows where a config gives none: measured per kernel set (DEQUANT_ROWS_BY_SET),
    0 (never) for the sets not yet measured against the integer GEMM."""
    from vllm_omni.ops import native

    return DEQUANT_ROWS_BY_SET.get(native.kernel_set(), 0)


# The config fields a kernel set gives a value to when the config names none.
_PER_SET = {"row_threshold": default_row_threshold, "dequant_rows": default_dequant_rows}


# The kernel's N granularity (output rows).
N_MULTIPLE = 16
# Tensors a layer holds after loading.
PACK, SCALES_ZEROS = "int4_packed", "int4_scales_zeros"
# The shards of fused layers, in vLLM's order (qkv_proj's loaded_shard_id is "q"/"k"/"v").
_QKV_SHARDS = ("q", "k", "v")


class CpuInt4Config(QuantizationConfig):
    """cpu_int4 settings. Every field that changes the traced graph (group_size, row_threshold,
    activation_bits, dequant_rows become constants of the op call) is a field here, so it is part
    of the checkpoint's config and of vLLM's compile-cache key, never an environment variable. A
    config without row_threshold or dequant_rows takes the kernel set's (_PER_SET) and writes
    none, so a checkpoint quantized on one CPU takes each CPU's own."""

    ACTIVATION_BITS = 16  # the default of this method

    def __init__(self, group_size: int = grid.DEFAULT_GROUP_SIZE,
                 ignored_modules: list[str] | None = None,
                 row_threshold: int | None = None,
                 checkpoint_quantized: bool = False,
                 activation_bits: int | None = None,
                 dequant_rows: int | None = None) -> None:
        super().__init__()
        if activation_bits is None:
            activation_bits = self.ACTIVATION_BITS
        if not isinstance(activation_bits, int) or isinstance(activation_bits, bool) \
                or activation_bits not in int4_linear.ACTIVATION_BITS:
            raise OmniInputError(f"quantization_config.activation_bits: must be one of "
                                 f"{list(int4_linear.ACTIVATION_BITS)}, got {activation_bits!r}")
        self.activation_bits = activation_bits
        if group_size not in grid.GROUP_SIZES:
            raise OmniInputError(f"quantization_config.group_size: must be one of "
                                 f"{list(grid.GROUP_SIZES)}, got {group_size!r}")
        given = {"row_threshold": row_threshold, "dequant_rows": dequant_rows}
        for name, value in given.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise OmniInputError(f"quantization_config.{name}: must be an int >= 0, "
                                     f"got {value!r}")
        ignored = list(ignored_modules or [])
        if not isinstance(ignored_modules, (list, tuple, type(None))) \
                or not all(isinstance(m, str) for m in ignored):
            raise OmniInputError(f"quantization_config.ignored_modules: must be a list of "
                                 f"module names, got {ignored_modules!r}")
        self.group_size = group_size
        self.ignored_modules = ignored
        self._given = given  # None: the kernel set's, resolved when first read
        self._resolved: dict[str, int] = {}
        # True: the checkpoint holds weight_packed/scale/zero; False: bf16, quantize at load.
        self.checkpoint_quantized = checkpoint_quantized

    def _per_set(self, name: str) -> int:
        """The config's value, else the kernel set's (read when a layer first needs it, so
        writing a checkpoint loads no kernels)."""
        if self._given[name] is not None:
            return self._given[name]
        if name not in self._resolved:
            self._resolved[name] = _PER_SET[name]()
        return self._resolved[name]

    @property
    def row_threshold(self) -> int:
        """Rows from which a layer takes the int4 GEMM instead of the GEMV."""
        return self._per_set("row_threshold")

    @property
    def dequant_rows(self) -> int:
        """Rows from which a W4A16 layer dequantizes for a bf16 matmul (0: never)."""
        return self._per_set("dequant_rows")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(group_size={self.group_size}, row_threshold="
                f"{self.row_threshold}, dequant_rows={self.dequant_rows}, "
                f"activation_bits={self.activation_bits}, "
                f"ignored_modules={len(self.ignored_modules)}, "
                f"checkpoint_quantized={self.checkpoint_quantized})")

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # CPU only: no GPU capability applies

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # empty: LLM(quantization="cpu_int4") on a bf16 checkpoint quantizes at load

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CpuInt4Config:
        method = config.get("quant_method", QUANT_METHOD)
        if method != QUANT_METHOD:
            raise OmniInputError(f"quantization_config.quant_method: expected "
                                 f"{QUANT_METHOD!r}, got {method!r}")
        unknown = set(config) - {"quant_method", "group_size", "ignored_modules",
                                 "row_threshold", "activation_bits", "dequant_rows"}
        if unknown:
            raise OmniInputError(f"quantization_config: unknown field(s) {sorted(unknown)}")
        return cls(group_size=config.get("group_size", grid.DEFAULT_GROUP_SIZE),
                   ignored_modules=config.get("ignored_modules", []),
                   row_threshold=config.get("row_threshold"),
                   checkpoint_quantized=True,
                   activation_bits=config.get("activation_bits", cls.ACTIVATION_BITS),
                   dequant_rows=config.get("dequant_rows"))

    def to_dict(self) -> dict[str, Any]:
        """The ``quantization_config`` block of config.json (``activation_bits`` only when not
        16, so the checkpoints written before it existed are written the same)."""
        out = {"quant_method": QUANT_METHOD, "group_size": self.group_size,
               "ignored_modules": list(self.ignored_modules)}
        out.update({k: v for k, v in self._given.items() if v is not None})
        if self.activation_bits != 16:
            out["activation_bits"] = self.activation_bits
        return out

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        if self.ignored_modules:
            self.ignored_modules = hf_to_vllm_mapper.apply_list(self.ignored_modules)

    def is_ignored(self, prefix: str) -> bool:
        """Whether the module stays bf16. A fused module (qkv_proj) is ignored when its parts
        are; a checkpoint that ignores only some parts of one fused module is rejected."""
        if not prefix:  # vLLM's LlamaModel builds embed_tokens without a prefix
            return any(m.rsplit(".", 1)[-1] == "embed_tokens" for m in self.ignored_modules)
        head, _, last = prefix.rpartition(".")
        parts = self.packed_modules_mapping.get(last)
        names = [f"{head}.{p}" if head else p for p in parts] if parts else [prefix]
        hit = [n for n in names if n in self.ignored_modules or prefix in self.ignored_modules]
        if hit and len(hit) != len(names):
            raise OmniInputError(f"{prefix}: ignored_modules lists {hit} but not the other "
                                 f"parts of this fused layer {sorted(set(names) - set(hit))}")
        return bool(hit)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            if self.is_ignored(prefix):
                return UnquantizedLinearMethod()
            return CpuInt4LinearMethod(self, prefix)
        if isinstance(layer, VocabParallelEmbedding):
            if self.is_ignored(prefix):
                return None  # vLLM falls back to UnquantizedEmbeddingMethod
            return CpuInt4LinearMethod(self, prefix or "embed_tokens")
        return None


class CpuInt4A8Config(CpuInt4Config):
    """``cpu_int4_a8``: cpu_int4 with W4A8 activations (``activation_bits`` 8), on the same
    weights: a bf16 checkpoint quantized at load, or a cpu_int4 checkpoint read as cpu_int4_a8."""

    ACTIVATION_BITS = 8

    def get_name(self) -> str:
        return QUANT_METHOD_A8

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CpuInt4A8Config:
        config = dict(config)
        if config.get("quant_method") == QUANT_METHOD_A8:
            config["quant_method"] = QUANT_METHOD
        config["activation_bits"] = cls.ACTIVATION_BITS  # the method asked for wins
        return super().from_config(config)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant,
                                     hf_config: Any = None) -> str | None:
        """A cpu_int4 checkpoint asked for as cpu_int4_a8 (vLLM otherwise refuses the pair)."""
        if user_quant == QUANT_METHOD_A8 and (hf_quant_cfg or {}).get("quant_method") in (
                QUANT_METHOD, QUANT_METHOD_A8):
            return QUANT_METHOD_A8
        return None


class _LayerState:
    """What one layer's method needs to know between create_weights and after loading."""

    def __init__(self, name: str, n: int, k: int, full_n: int, full_k: int,
                 shards: tuple, shard_names: dict, dense: bool) -> None:
        self.name, self.n, self.k, self.full_n, self.full_k = name, n, k, full_n, full_k
        self.shards, self.shard_names, self.dense = shards, shard_names, dense
        self.tensor_names: tuple[str, ...] = ()
        self.loaded: set[tuple[str, object]] = set()
        self.processed = False
        self.tied_source: torch.nn.Module | None = None


def _shards_of(layer: torch.nn.Module, prefix: str,
               mapping: dict[str, list[str]]) -> tuple[tuple, dict, dict]:
    """(shard ids, shard id -> checkpoint name, shard id -> full rows) of a layer."""
    head, _, last = prefix.rpartition(".")
    parts = mapping.get(last) or []
    sizes = getattr(layer, "output_sizes", None)
    if sizes and len(sizes) > 1:
        ids = _QKV_SHARDS if len(sizes) == 3 and "qkv" in last else tuple(range(len(sizes)))
        names = {sid: (f"{head}.{parts[i]}" if head else parts[i]) if i < len(parts)
                 else f"{prefix}[{sid}]" for i, sid in enumerate(ids)}
        return ids, names, dict(zip(ids, sizes))
    return (None,), {None: prefix}, {None: None}


class CpuInt4LinearMethod(LinearMethodBase):
    """W4A16 linear for LinearBase layers, and the same for ParallelLMHead and
    VocabParallelEmbedding (``embedding`` dequantizes only the looked-up rows)."""

    def __init__(self, config: CpuInt4Config, prefix: str) -> None:
        self.config = config
        self.prefix = prefix
        # Read now, at model construction: apply() runs inside dynamo's trace, which cannot
        # follow the kernel set's lookup (it reads /proc/cpuinfo).
        self.row_threshold = config.row_threshold
        self.dequant_rows = config.dequant_rows

    # -- weights -----------------------------------------------------------------------------

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        # Normally done by the plugin already; apply() needs the ops. It also builds or loads
        # the native kernels, here in the worker, before anything is traced.
        int4_linear.register()
        cfg = self.config
        g = cfg.group_size
        n, k = sum(output_partition_sizes), input_size_per_partition
        is_vocab = isinstance(layer, VocabParallelEmbedding)
        if is_vocab:
            full_n, full_k = layer.org_vocab_size, layer.embedding_dim
            shards, names, sizes = (None,), {None: self.prefix}, {None: full_n}
        else:
            full_n, full_k = layer.output_size, layer.input_size
            shards, names, sizes = _shards_of(layer, self.prefix, cfg.packed_modules_mapping)
            if sizes == {None: None}:
                sizes = {None: full_n}
        problems = []
        if k % g:
            problems.append(f"K={k} does not divide by group_size={g}")
        if n % N_MULTIPLE:
            problems.append(f"N={n} is not a multiple of {N_MULTIPLE}")
        dense = bool(problems)
        if dense and cfg.checkpoint_quantized:
            raise OmniInputError(f"{self.prefix}: cannot be cpu_int4 ({'; '.join(problems)}) "
                                 "and is not listed in quantization_config.ignored_modules")
        if dense:
            logger.warning("cpu_int4: %s stays bf16: %s", self.prefix, "; ".join(problems))
        st = _LayerState(self.prefix, n, k, full_n, full_k, shards, names, dense)
        st.sizes = sizes
        layer.cpu_int4 = st
        loader = extra_weight_attrs["weight_loader"]

        def add(name: str, param: Parameter) -> None:
            layer.register_parameter(name, param)
            st.tensor_names += (name,)

        # Each weight is packed as soon as all its tensors and shards are in, and the pages of
        # its checkpoint layout unmapped (they sit on mappings of their own: torch.empty takes
        # a small tensor from the C heap, whose freed pages stay resident), so neither the
        # whole bf16 model (quantized at load) nor the whole checkpoint layout is ever resident
        # beside the packed weights; untouched pages are not resident either.
        done = None if dense else functools.partial(self._pack_loaded, layer)
        place = weight_arena.own_mapping if not dense else \
            (lambda shape, dtype: torch.empty(shape, dtype=dtype))
        if dense or not cfg.checkpoint_quantized:
            add("weight", ModelWeightParameter(
                data=place((n, k), params_dtype), input_dim=1, output_dim=0,
                weight_loader=self._checked_loader(st, "weight", loader, done)))
            return
        add(grid.PACKED, PackedvLLMParameter(
            data=place((n, k // 2), torch.uint8), input_dim=1, output_dim=0,
            packed_dim=1, packed_factor=2,
            weight_loader=self._checked_loader(st, grid.PACKED, loader, done)))
        for name in (grid.SCALE, grid.ZERO):
            add(name, GroupQuantScaleParameter(
                data=place((n, k // g), torch.bfloat16), input_dim=1, output_dim=0,
                weight_loader=self._checked_loader(st, name, loader, done)))

    def _expected(self, st: _LayerState, tensor: str, shard) -> tuple[tuple[int, int],
                                                                       torch.dtype]:
        rows = st.sizes.get(shard) if shard in st.sizes else None
        if rows is None:
            rows = st.full_n
        if tensor == "weight":
            return (rows, st.full_k), None
        return grid.expected_shapes(rows, st.full_k, self.config.group_size)[tensor], \
            grid.TENSOR_DTYPES[tensor]

    def _checked_loader(self, st: _LayerState, tensor: str, inner, done=None):
        """``inner`` with the checkpoint's shape and dtype checked first; ``done()`` once every
        tensor and shard of the layer is loaded, or ``done(loaded_weight)`` instead of ``inner``
        when one call brings the whole weight as the parameter holds it (packed from the
        checkpoint's tensor, which safetensors maps from the file: the bf16 parameter is never
        written)."""
        def load(param, loaded_weight, *args, **kwargs):
            shard = args[0] if args else kwargs.get("loaded_shard_id")
            if shard is None:
                shard = getattr(loaded_weight, "shard_id", None)
            where = st.shard_names.get(shard, st.name) if shard is not None else st.name
            shape, dtype = self._expected(st, tensor, shard)
            if dtype is not None and loaded_weight.dtype != dtype:
                raise OmniInputError(f"{where}: {tensor} has dtype {loaded_weight.dtype}, "
                                     f"cpu_int4 expects {dtype}")
            if tuple(loaded_weight.shape) != tuple(shape):
                raise OmniInputError(f"{where}: {tensor} has shape {tuple(loaded_weight.shape)},"
                                     f" cpu_int4 with group_size={self.config.group_size} "
                                     f"expects {tuple(shape)}")
            whole = (tensor == "weight" and done is not None and shard is None
                     and not args and not kwargs
                     and loaded_weight.dtype == param.dtype
                     and tuple(loaded_weight.shape) == tuple(param.shape))
            if whole:  # packed straight from the checkpoint's (mapped) tensor: no bf16 copy
                done(loaded_weight)
            else:
                inner(param, loaded_weight, *args, **kwargs)
            covered = shard if isinstance(shard, tuple) else (shard,)
            if covered == (None,):
                covered = st.shards
            for s in covered:
                st.loaded.add((tensor, s))
            if done is not None and not whole and all((t, s) in st.loaded
                                                      for t in st.tensor_names
                                                      for s in st.shards):
                done()
        return load

    def _check_complete(self, st: _LayerState) -> None:
        for tensor in st.tensor_names:
            for shard in st.shards:
                if (tensor, shard) not in st.loaded:
                    raise OmniInputError(f"{st.shard_names.get(shard, st.name)}: {tensor} is "
                                         "missing from the checkpoint")

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        st: _LayerState = layer.cpu_int4
        if st.processed:
            return
        if st.tied_source is not None:
            src = st.tied_source
            src.quant_method.process_weights_after_loading(src)
            for name in st.tensor_names:
                if name in layer._parameters:
                    del layer._parameters[name]
            for name in (PACK, SCALES_ZEROS):
                setattr(layer, name, getattr(src, name))
            st.processed = True
            return
        self._check_complete(st)
        if st.dense:
            st.processed = True
            return
        self._pack_loaded(layer)  # the loader packs each weight once loaded; not this one

    def _pack_loaded(self, layer: torch.nn.Module, source: torch.Tensor | None = None) -> None:
        """A loaded weight to the packed layout, its checkpoint layout freed at once: the
        checkpoint's packed tensors repacked, or a bf16 weight (or ``source``, the whole of it
        as the checkpoint holds it) quantized. The packed tensors go to huge-page mappings: a
        decode step streams them all. ``after_chunk``: every few chunks the temporaries, once
        freed, leave glibc's heaps."""
        st: _LayerState = layer.cpu_int4
        if st.processed:
            return
        if self.config.checkpoint_quantized:
            packed, sz = int4_pack.repack(layer.weight_packed.data, layer.weight_scale.data,
                                          layer.weight_zero.data, empty=weight_arena.empty,
                                          after_chunk=weight_arena.after_chunk)
        else:
            w = layer.weight.data if source is None else source
            packed, sz = int4_pack.quantize_and_pack(w, self.config.group_size,
                                                     empty=weight_arena.empty,
                                                     after_chunk=weight_arena.after_chunk)
        self._replace(layer, packed, sz)

    @staticmethod
    def _replace(layer: torch.nn.Module, packed: torch.Tensor, sz: torch.Tensor) -> None:
        """The checkpoint layout's parameters dropped and their storage freed (the model's
        ``load_weights`` still holds the Parameter objects until it returns), the packed ones
        registered."""
        st: _LayerState = layer.cpu_int4
        for name in st.tensor_names:
            param = layer._parameters.pop(name)
            param.data = torch.empty(0, dtype=param.dtype)
        layer.register_parameter(PACK, Parameter(packed, requires_grad=False))
        layer.register_parameter(SCALES_ZEROS, Parameter(sz, requires_grad=False))
        st.processed = True

    # -- tied embedding ----------------------------------------------------------------------

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module):
        """The head shares the embedding's tensors (both quantized) or its bf16 weight."""
        src_method = embed_tokens.quant_method
        st: _LayerState = layer.cpu_int4
        for name in st.tensor_names:
            if name in layer._parameters:
                del layer._parameters[name]
        if isinstance(src_method, CpuInt4LinearMethod) and not embed_tokens.cpu_int4.dense \
                and not st.dense:
            src_st = embed_tokens.cpu_int4
            for name in src_st.tensor_names:
                setattr(layer, name, getattr(embed_tokens, name))
            st.tensor_names = src_st.tensor_names
            st.tied_source = embed_tokens
            return layer
        # The embedding stays bf16 (ignored, or a shape int4 cannot take): share it as is.
        logger.warning("cpu_int4: %s is tied to a bf16 embedding and stays bf16", self.prefix)
        layer.quant_method = UnquantizedEmbeddingMethod()
        layer.weight = embed_tokens.weight
        del layer.cpu_int4
        return layer

    # -- compute -----------------------------------------------------------------------------

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        if layer.cpu_int4.dense:
            return F.linear(x, layer.weight, bias)
        # The op itself, not int4_linear.op(): registration takes a lock dynamo cannot trace.
        return torch.ops.vllm_omni.cpu_int4_linear(
            x, getattr(layer, PACK), getattr(layer, SCALES_ZEROS), self.config.group_size,
            self.row_threshold, bias, self.config.activation_bits, self.dequant_rows)

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        if layer.cpu_int4.dense:
            return F.embedding(input_, layer.weight)
        return torch.ops.vllm_omni.cpu_int4_embedding(
            input_, getattr(layer, PACK), getattr(layer, SCALES_ZEROS), layer.cpu_int4.k)


_register_lock = threading.Lock()


def register() -> None:
    """Make ``cpu_int4`` a vLLM quantization method in this process (idempotent)."""
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers import quantization as q

    with _register_lock:
        int4_linear.register()
        for name, cls in ((QUANT_METHOD, CpuInt4Config), (QUANT_METHOD_A8, CpuInt4A8Config)):
            if q._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(name) is not cls:
                q.register_quantization_config(name)(cls)
        # Without this the layers hand our parameters to the old weight_loader.
        if CpuInt4LinearMethod.__name__ not in linear.WEIGHT_LOADER_V2_SUPPORTED:
            linear.register_weight_loader_v2_supported_method(CpuInt4LinearMethod)


def is_registered() -> bool:
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers import quantization as q

    return (q._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(QUANT_METHOD) is CpuInt4Config
            and q._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(QUANT_METHOD_A8) is CpuInt4A8Config
            and CpuInt4LinearMethod.__name__ in linear.WEIGHT_LOADER_V2_SUPPORTED
            and int4_linear.registered())
