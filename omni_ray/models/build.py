"""Build a Hugging Face Llama directory with seeded random bf16 weights and a local tokenizer.

Same shape, seed and tying give byte-identical weights: each block of ``BLOCK_ELEMS`` elements
(whole rows) of a tensor draws from its own generator seeded by (seed, tensor name, block).
Built models are cached under ``$OMNI_RAY_CACHE/models`` keyed on exactly that, so a sweep never
rebuilds one.

The build streams: each block goes to its safetensors shard as soon as it is drawn
(``vllm_omni.quantization.shards``), so the process holds one block, never the model: an 8B
shape (16 GB of bf16) builds on a machine with less memory than that. Before anything is written
the free disk space is checked against the bytes the build writes; the build happens in
``.NAME.partial-PID`` beside the target and is renamed into place at the end, and a partial
directory left by a build that died is removed by the next one. The stamp records the peak RSS
of each step (``peak_rss``: weights, tokenizer).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TextIO

from omni_ray import envs
from omni_ray.errors import UserError
from omni_ray.models.shapes import SHAPES, Shape

# Bump when the bytes a build writes change for the same (shape, seed, tie).
# 2: weights drawn per block of rows, written in shards of at most SHARD_BYTES.
BUILDER_VERSION = 2
STAMP = "omni_model.json"
INIT_STD = 0.02
# Elements drawn from one generator (whole rows, at least one): part of what the bytes are.
BLOCK_ELEMS = 1 << 16
SHARD_BYTES = 2 << 30
# Disk kept aside for the tokenizer, config and stamp files besides the weights.
SMALL_FILES_BYTES = 64 << 20
_METADATA = {"format": "pt"}  # safetensors metadata, as save_file(..., metadata=) wrote it


def get_shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise UserError(f"unknown shape {name!r}; known shapes: {', '.join(SHAPES)}") from None


def _tensor_names(shape: Shape, tie: bool) -> dict[str, tuple[int, ...]]:
    h, d, i = shape.hidden_size, shape.head_dim, shape.intermediate_size
    names = {"model.embed_tokens.weight": (shape.vocab_size, h)}
    for layer in range(shape.num_layers):
        p = f"model.layers.{layer}."
        names |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (shape.num_heads * d, h),
            p + "self_attn.k_proj.weight": (shape.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": (shape.num_kv_heads * d, h),
            p + "self_attn.o_proj.weight": (h, shape.num_heads * d),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    names["model.norm.weight"] = (h,)
    if not tie:
        names["lm_head.weight"] = (shape.vocab_size, h)
    return names


def tensor_specs(shape: Shape, tie: bool) -> list:
    """Every weight the build writes, in order, as ``TensorSpec`` (bf16)."""
    import torch

    from vllm_omni.quantization.shards import TensorSpec

    return [TensorSpec(n, torch.bfloat16, dims) for n, dims in _tensor_names(shape, tie).items()]


def _tensor_blocks(name: str, dims: tuple[int, ...], seed: int):
    """The tensor's values, block after block of whole rows (their bytes in file order)."""
    import torch

    from vllm_omni.quantization.shards import row_blocks

    if name.endswith("norm.weight"):
        yield torch.ones(dims, dtype=torch.bfloat16)
        return
    rest = dims[1:]
    row_elems = 1
    for d in rest:
        row_elems *= d
    for i, (start, stop) in enumerate(row_blocks(dims[0], row_elems, BLOCK_ELEMS)):
        digest = hashlib.sha256(f"{seed}:{name}:{i}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        block = torch.randn((stop - start, *rest), generator=gen, dtype=torch.float32)
        yield block.mul_(INIT_STD).to(torch.bfloat16)


def _shard_plan(shape: Shape, tie: bool):
    from vllm_omni.quantization.shards import plan_shards, shard_names

    shards = plan_shards(tensor_specs(shape, tie), SHARD_BYTES)
    return shard_names(len(shards)), shards


def bytes_needed(shape: Shape, tie: bool) -> int:
    """Disk bytes a build writes: the weight files plus room for the small files."""
    from vllm_omni.quantization.shards import file_bytes

    _, shards = _shard_plan(shape, tie)
    return sum(file_bytes(s, _METADATA) for s in shards) + SMALL_FILES_BYTES



def _hf_config(shape: Shape, tie: bool) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rope_scaling": shape.rope_scaling.to_dict() if shape.rope_scaling else None,
        "rms_norm_eps": shape.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tie,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "initializer_range": INIT_STD,
    }


def stamp_for(shape: Shape, seed: int, tie: bool) -> dict:
    return {"builder": "omni-ray make-model", "builder_version": BUILDER_VERSION,
            "shape": shape.name, "seed": seed, "tie_embeddings": tie,
            "num_parameters": shape.num_parameters(tie)}


def _read_stamp(out: Path) -> dict | None:
    try:
        return json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return None


# Files without which a stamped directory is not a usable build (someone deleted them), besides
# the weight files its stamp lists.
_REQUIRED = ("config.json", "tokenizer.json", "tokenizer_config.json")


def _stamp_matches(out: Path, want: dict) -> bool:
    have = _read_stamp(out)
    if have is None or not all(have.get(k) == v for k, v in want.items()):
        return False
    weights = have.get("weights_sha256")
    return (isinstance(weights, dict) and bool(weights)
            and all((out / f).is_file() for f in (*_REQUIRED, *weights)))


def _not_a_directory(path: Path) -> Path | None:
    """The first of ``path`` and its ancestors that exists but is not a directory, if any."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def _write(shape: Shape, seed: int, tie: bool, out: Path, progress: TextIO | None) -> None:
    from omni_ray.measure.peak import step_peak
    from omni_ray.models.progress import Progress
    from omni_ray.models.tokenizer import save_tokenizer, train_tokenizer
    from vllm_omni.quantization.shards import INDEX, ShardWriter, index_json

    names, shards = _shard_plan(shape, tie)
    total = sum(spec.nbytes for specs in shards for spec in specs)
    peaks = {}
    shas: dict[str, str] = {}
    with step_peak() as peak:
        bar = Progress(f"{shape.name}: weights", total, progress) if progress else None
        for fname, specs in zip(names, shards):
            writer = ShardWriter(out / fname, specs, _METADATA)
            try:
                for spec in specs:
                    for block in _tensor_blocks(spec.name, spec.shape, seed):
                        writer.write(spec.name, block)
                        if bar:
                            bar.advance(block.numel() * block.element_size())
            except BaseException:
                writer.abort()
                raise
            shas[fname] = writer.close()
        if bar:
            bar.close()
        if len(names) > 1:
            (out / INDEX).write_text(index_json(shards, names))
    peaks["weights"] = peak.as_dict()
    (out / "config.json").write_text(json.dumps(_hf_config(shape, tie), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 0, "do_sample": False}, indent=2))
    with step_peak() as peak:
        save_tokenizer(train_tokenizer(shape.tokenizer_vocab, seed), out,
                       shape.max_position_embeddings)
    peaks["tokenizer"] = peak.as_dict()
    stamp = stamp_for(shape, seed, tie) | {
        "weights_sha256": shas, "weight_bytes": total,
        "peak_rss": peaks | {"unit": "bytes", "how": "VmHWM of /proc/self/status, reset "
                             "per step through /proc/self/clear_refs (reset: false = not reset)"}}
    (out / STAMP).write_text(json.dumps(stamp, indent=2))


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _partial_prefix(out: Path) -> str:
    return f".{out.name}.partial-"


def _remove_dead_partials(out: Path) -> None:
    """Remove ``.NAME.partial-PID`` directories whose build process is gone (it was killed)."""
    prefix = _partial_prefix(out)
    for p in out.parent.glob(prefix + "*"):
        pid = p.name[len(prefix):]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            if int(pid) != os.getpid():
                continue  # another build of the same target is running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, someone else's
        shutil.rmtree(p, ignore_errors=True)


def build_model(shape_name: str, out_dir: str | os.PathLike, *, seed: int = 0,
                tie_embeddings: bool | None = None, force: bool = False,
                progress: TextIO | None = None) -> Path:
    """Write the model into ``out_dir`` (skipped when it already holds this exact build).

    ``progress``: a stream for the progress bar of the weights (None: silent).
    """
    shape = get_shape(shape_name)
    tie = shape.tie_embeddings if tie_embeddings is None else tie_embeddings
    out = Path(out_dir).expanduser().resolve()
    want = stamp_for(shape, seed, tie)
    if not force and _stamp_matches(out, want):
        return out
    blocker = _not_a_directory(out)
    if blocker is not None:
        raise UserError(f"{out}: cannot write the model there: {blocker} is not a directory")
    if out.exists() and any(out.iterdir()) and not force and _read_stamp(out) is None:
        raise UserError(f"{out}: exists and is not a model made by make-model; "
                        "choose an empty directory or pass --force")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot write the model there: {exc.strerror}") from None
    _remove_dead_partials(out)
    need, free = bytes_needed(shape, tie), _free_bytes(out.parent)
    if need > free:
        raise UserError(f"{out}: not enough disk space for {shape.name}: needs {need} bytes "
                        f"({need / 1e9:.2f} GB), {free} bytes ({free / 1e9:.2f} GB) free")
    tmp = out.parent / f"{_partial_prefix(out)}{os.getpid()}"
    try:
        tmp.mkdir()
    except OSError as exc:
        raise UserError(f"{out}: cannot write the model there: {exc.strerror}") from None
    try:
        _write(shape, seed, tie, tmp, progress)
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@contextlib.contextmanager
def _lock(path: Path):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "w")
    except OSError as exc:
        raise UserError(f"{path.parent}: cannot write the model cache there ({exc.strerror}); "
                        f"set {envs.OMNI_RAY_CACHE} to a writable directory") from None
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def cached_model_dir(shape_name: str, seed: int = 0, tie_embeddings: bool | None = None) -> Path:
    shape = get_shape(shape_name)
    tie = shape.tie_embeddings if tie_embeddings is None else tie_embeddings
    key = f"{shape.name}-seed{seed}-{'tied' if tie else 'untied'}-v{BUILDER_VERSION}"
    return envs.cache_dir() / "models" / key


def ensure_model(shape_name: str, *, seed: int = 0, tie_embeddings: bool | None = None,
                 progress: TextIO | None = sys.stderr) -> Path:
    """The cached model directory for this build, built once (safe across processes)."""
    out = cached_model_dir(shape_name, seed, tie_embeddings)
    with _lock(out.parent / (out.name + ".lock")):  # not with_suffix: "qwen2.5-0.5b-..."
        return build_model(shape_name, out, seed=seed, tie_embeddings=tie_embeddings,
                           progress=progress)


def check_model_dir(path: str | os.PathLike, what: str = "model") -> Path:
    """A local HF model directory, validated enough to fail early with a one-line message."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise UserError(f"{what}: {p}: no such directory")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise UserError(f"{what}: {p}: not a Hugging Face model directory (no config.json)")
    try:
        config = json.loads(cfg.read_text())
    except ValueError as exc:
        raise UserError(f"{what}: {cfg}: malformed JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UserError(f"{what}: {cfg}: not a model config (a JSON object), "
                        f"got a {type(config).__name__}")
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise UserError(f"{what}: {p}: no weights (*.safetensors or *.bin)")
    return p.resolve()


def resolve_model(model: str) -> Path:
    """A shape name becomes its cached build; anything else must be a model directory."""
    if model in SHAPES:
        return ensure_model(model)
    if not Path(model).expanduser().exists() and os.sep not in model:
        raise UserError(f"model: {model}: neither a directory nor a shape "
                        f"(known shapes: {', '.join(SHAPES)})")
    return check_model_dir(model)
