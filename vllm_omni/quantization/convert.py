"""Write a cpu_int4 checkpoint from a Hugging Face safetensors checkpoint (bf16/fp16/fp32).

The result loads with plain ``vllm.LLM(model=dst)`` once omni-ray is installed (the plugin
registers the method; config.json names it). What is written:

- ``*.safetensors``: every 2-D ``*.weight`` of a linear layer, the input embedding and the
  output head as ``weight_packed`` / ``weight_scale`` / ``weight_zero``; everything else as it
  was. A tied head (``tie_word_embeddings``) is not written: it shares the embedding's tensors.
- ``config.json``: the source's, plus ``quantization_config``.
- every other file of the source (tokenizer, generation config) copied.
- ``omni_quantize.json``: the source path, the sha256 of each source file used, the settings,
  and the layers left bf16 with the reason.

A layer int4 cannot take (N not a multiple of 16, K not a multiple of the group) stays bf16 and
is listed in ``ignored_modules`` with a warning; the parts of a fused layer (q/k/v, gate/up)
stay bf16 together, because vLLM loads them into one tensor.

Streams: every output file's header is planned from the source's headers first, then each
tensor is read (``pread``, not a memory map whose pages would stay in RSS) and quantized in
blocks of rows and appended (``vllm_omni.quantization.shards``); only one block, plus the
scales and zeros of the layer being written (1/64 of its bf16 bytes), is in memory. The free
disk space is checked against the planned bytes before anything is written; the checkpoint is
built in ``DST.partial`` (removed first if a killed run left it) and renamed at the end.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import os
import resource
import shutil
from pathlib import Path

import torch

from vllm_omni.errors import OmniInputError
from vllm_omni.quantization import grid
from vllm_omni.quantization.shards import (INDEX, ShardWriter, StoredTensor, TensorSpec,
                                           file_bytes, index_json, plan_shards, read_header,
                                           read_rows, row_blocks, shard_names)

logger = logging.getLogger("vllm.omni")

QUANT_METHOD = "cpu_int4"
RECORD = "omni_quantize.json"
RECORD_SCHEMA_VERSION = 1
# Source files that are rewritten rather than copied.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_REWRITTEN = {"config.json", "model.safetensors.index.json", RECORD}
# Parts vLLM fuses into one layer: they must all be int4 or all bf16.
FUSED_PARTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
VOCAB_MODULES = ("embed_tokens", "lm_head")
N_MULTIPLE = 16
SHARD_BYTES = 2 << 30
# Elements of the source read (and quantized) at a time.
BLOCK_ELEMS = 1 << 20
_METADATA = {"format": "pt"}


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    dst: Path
    quantized: list[str]  # module names now int4
    ignored: dict[str, str]  # module name -> why it stayed bf16
    record: dict


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _weight_files(src: Path) -> list[Path]:
    index = src / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [src / f for f in files]
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise OmniInputError(f"{src}: no *.safetensors weights (only safetensors checkpoints "
                             "can be quantized)")
    return files


def _problem(name: str, shape: tuple[int, ...], group_size: int) -> str | None:
    """Why the weight [N, K] of module ``name`` cannot be int4, or None."""
    n, k = shape
    vocab = name.rsplit(".", 1)[-1] in VOCAB_MODULES  # vLLM pads the vocab to a multiple of 64
    if k % group_size:
        return f"K={k} does not divide by group_size={group_size}"
    if not vocab and n % N_MULTIPLE:
        return f"N={n} is not a multiple of {N_MULTIPLE}"
    return None


def plan(shapes: dict[str, tuple[int, ...]], group_size: int,
         tie_word_embeddings: bool) -> tuple[list[str], dict[str, str]]:
    """(modules to quantize, modules left bf16 -> reason) from tensor name -> shape."""
    candidates = {n[: -len(".weight")]: s for n, s in shapes.items()
                  if n.endswith(".weight") and len(s) == 2}
    ignored = {m: p for m, s in candidates.items() if (p := _problem(m, s, group_size))}
    # Fused parts stay bf16 together.
    for m in list(candidates):
        head, _, last = m.rpartition(".")
        for parts in FUSED_PARTS:
            if last in parts:
                siblings = [f"{head}.{p}" if head else p for p in parts]
                bad = [s for s in siblings if s in ignored]
                if bad and m not in ignored:
                    ignored[m] = f"fused with {bad[0]} ({ignored[bad[0]]})"
    if tie_word_embeddings:
        embed = next((m for m in candidates if m.endswith("embed_tokens")), None)
        if embed in ignored:
            for m in candidates:
                if m.endswith("lm_head") and m not in ignored:
                    ignored[m] = f"tied to {embed} ({ignored[embed]})"
    quantized = [m for m in candidates if m not in ignored]
    return quantized, ignored


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _module(name: str) -> str | None:
    return name[: -len(".weight")] if name.endswith(".weight") else None


def _output_specs(spec: TensorSpec, qset: set[str], group_size: int) -> list[TensorSpec]:
    """What the checkpoint holds for one source tensor: three int4 tensors or the tensor."""
    module = _module(spec.name)
    if module not in qset:
        return [spec]
    n, k = spec.shape
    shapes = grid.expected_shapes(n, k, group_size)
    return [TensorSpec(f"{module}.{part}", grid.TENSOR_DTYPES[part], shapes[part])
            for part in (grid.PACKED, grid.SCALE, grid.ZERO)]


def _pieces(stored: list[StoredTensor], qset: set[str], group_size: int):
    """(output name, its pieces) in ``_output_specs`` order, reading the source by row blocks.

    A quantized layer's packed codes stream out block by block while its scales and zeros
    collect (1/64 of the layer's bf16 bytes at group 128); they follow once all rows are done.
    """
    for t in stored:
        module = _module(t.spec.name)
        n_rows = t.spec.shape[0] if t.spec.shape else 1
        blocks = list(row_blocks(n_rows, _row_elems(t.spec), BLOCK_ELEMS))
        if module not in qset:
            yield t.spec.name, (read_rows(t, a, b) if t.spec.shape else read_rows(t)
                                for a, b in blocks)
            continue
        scales, zeros = [], []

        def packed(t=t, blocks=blocks, scales=scales, zeros=zeros):
            for a, b in blocks:
                qw = grid.quantize(read_rows(t, a, b), group_size)
                scales.append(qw.scale)
                zeros.append(qw.zero)
                yield qw.packed
                del qw
                _trim_heap()

        yield f"{module}.{grid.PACKED}", packed()
        yield f"{module}.{grid.SCALE}", iter(scales)
        yield f"{module}.{grid.ZERO}", iter(zeros)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def _trim_heap() -> None:
    """Give freed heap back to the OS after each block.

    glibc raises its mmap threshold to the size of each freed mmapped chunk, so after the
    first block the fp32 temporaries of quantization (tens of MB) come from the heap, which
    fragments and is not returned: without this a 3B-parameter conversion grew 1.8 GB over the
    588 MB of the imported interpreter; with it, measured in docs/sizes.md.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _row_elems(spec: TensorSpec) -> int:
    n = 1
    for d in spec.shape[1:]:
        n *= d
    return n


def _write_shards(tmp: Path, names: list[str], shards: list[list[TensorSpec]], pieces) -> None:
    for fname, specs in zip(names, shards):
        writer = ShardWriter(tmp / fname, specs, _METADATA)
        try:
            for _ in specs:
                name, piece_iter = next(pieces)
                for piece in piece_iter:
                    writer.write(name, piece)
        except BaseException:
            writer.abort()
            raise
        writer.close()
    if len(names) > 1:
        (tmp / INDEX).write_text(index_json(shards, names))


def _tied_head_names(names, tie: bool) -> set[str]:
    return {n for n in names if tie and n.rsplit(".", 2)[-2:-1] == ["lm_head"]}


def quantize_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, *,
                        group_size: int = grid.DEFAULT_GROUP_SIZE,
                        row_threshold: int | None = None,
                        dequant_rows: int | None = None,
                        overwrite: bool = False) -> ConvertResult:
    """Write the cpu_int4 checkpoint of ``src`` to ``dst``; see the module docstring."""
    from vllm_omni.quantization.cpu_int4 import CpuInt4Config

    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise OmniInputError(f"{src}: not a model directory (no config.json)")
    if src.resolve() == dst.resolve():
        raise OmniInputError(f"{dst}: the destination is the source")
    blocker = next((p for p in (dst, *dst.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise OmniInputError(f"{dst}: cannot write the checkpoint there: {blocker} is a file, "
                             "not a directory")
    if dst.exists() and any(dst.iterdir()) and not overwrite:
        raise OmniInputError(f"{dst}: exists and is not empty (pass overwrite=True / "
                             "--overwrite to replace it)")
    hf_config = json.loads((src / "config.json").read_text())
    if hf_config.get("quantization_config"):
        method = hf_config["quantization_config"].get("quant_method")
        raise OmniInputError(f"{src}/config.json: already quantized ({method})")
    cfg = CpuInt4Config(group_size=group_size, row_threshold=row_threshold,
                        dequant_rows=dequant_rows)
    tie = bool(hf_config.get("tie_word_embeddings", False))
    files = _weight_files(src)

    shapes = {t.spec.name: t.spec.shape for f in files for t in read_header(f)}
    skip = _tied_head_names(shapes, tie)
    quantized, ignored = plan({n: s for n, s in shapes.items() if n not in skip}, group_size,
                              tie)
    for m, why in sorted(ignored.items()):
        logger.warning("cpu_int4: %s stays bf16: %s", m, why)
    cfg.ignored_modules = sorted(ignored)
    qset = set(quantized)

    stored = [t for f in files for t in read_header(f) if t.spec.name not in skip]
    out_specs = [spec for t in stored for spec in _output_specs(t.spec, qset, group_size)]
    shards = plan_shards(out_specs, SHARD_BYTES)
    names = shard_names(len(shards))
    small = sum(p.stat().st_size for p in src.iterdir() if p.is_file()
                and not p.name.endswith(_WEIGHT_SUFFIXES)) + (1 << 20)
    need = sum(file_bytes(s, _METADATA) for s in shards) + small
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # what a killed run left
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OmniInputError(f"{dst}: cannot write the checkpoint there: {exc.strerror}") from None
    free = _free_bytes(tmp.parent)
    if need > free:
        raise OmniInputError(f"{dst}: not enough disk space: the checkpoint needs {need} bytes "
                             f"({need / 1e9:.2f} GB), {free} bytes ({free / 1e9:.2f} GB) free")
    try:
        tmp.mkdir()
    except OSError as exc:
        raise OmniInputError(f"{dst}: cannot write the checkpoint there: {exc.strerror}") from None

    try:
        _write_shards(tmp, names, shards, _pieces(stored, qset, group_size))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    hf_config["quantization_config"] = cfg.to_dict()
    (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    copied = []
    for p in sorted(src.iterdir()):
        if p.is_file() and p.name not in _REWRITTEN and not p.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(p, tmp / p.name)
            copied.append(p.name)

    used = [src / "config.json", *files]
    index = src / "model.safetensors.index.json"
    if index.is_file():
        used.append(index)
    file_hashes = {p.name: _sha256(p) for p in used}
    record = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": str(src.resolve()),
        "source_sha256": file_hashes,
        "source_hash": hashlib.sha256(json.dumps(file_hashes, sort_keys=True).encode())
        .hexdigest(),
        "quantization_config": cfg.to_dict(),
        "quantized_modules": len(quantized),
        "ignored_modules": dict(sorted(ignored.items())),
        "tied_head_dropped": sorted(skip),
        "copied_files": copied,
        "torch": torch.__version__,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_rss_how": "ru_maxrss of the converting process: its peak so far, the conversion "
                        "included (for `omni-ray quantize`, the conversion's)",
    }
    (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    return ConvertResult(dst, sorted(quantized), dict(sorted(ignored.items())), record)
