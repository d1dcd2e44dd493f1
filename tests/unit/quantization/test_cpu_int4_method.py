"""The vLLM method without an engine: config validation, registration, bad checkpoints."""

from pathlib import Path

import pytest
import torch

from vllm_omni.errors import OmniInputError
from vllm_omni.ops import weight_arena
from vllm_omni.quantization import cpu_int4, grid

pytestmark = pytest.mark.native  # imports vLLM's layers: not in make test-fast

H = 256


@pytest.fixture(autouse=True)
def _single_rank(monkeypatch):
    """vLLM parameters read the tensor-parallel rank at construction; no group exists here."""
    import vllm.model_executor.parameter as p

    monkeypatch.setattr(p, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(p, "get_tensor_model_parallel_world_size", lambda: 1)


def _copy_loader(param, loaded_weight, *args, **kwargs):
    shard = args[0] if args else None
    if shard is None:
        param.data.copy_(loaded_weight)
    else:
        idx = {"q": 0, "k": 1, "v": 2}[shard]
        offs = [0, 256, 384, 512]
        param.data[offs[idx]:offs[idx + 1]].copy_(loaded_weight)


class FakeQKV(torch.nn.Module):
    """What the method reads from vLLM's QKVParallelLinear."""

    def __init__(self, prefix):
        super().__init__()
        self.prefix, self.input_size, self.output_size = prefix, H, 512
        self.output_sizes = [256, 128, 128]


def _qkv(config=None, prefix="model.layers.1.self_attn.qkv_proj"):
    config = config or cpu_int4.CpuInt4Config.from_config({"group_size": 128})
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    layer = FakeQKV(prefix)
    method = cpu_int4.CpuInt4LinearMethod(config, prefix)
    method.create_weights(layer, H, [256, 128, 128], H, 512, torch.bfloat16,
                          weight_loader=_copy_loader)
    return layer, method


def _load(layer, shard, rows, drop=(), **override):
    qw = grid.quantize(torch.randn(rows, H).bfloat16(), 128)
    tensors = {grid.PACKED: qw.packed, grid.SCALE: qw.scale, grid.ZERO: qw.zero, **override}
    for name, t in tensors.items():
        if name not in drop:
            p = getattr(layer, name)
            p.weight_loader(p, t, shard)


def test_qkv_loads_repacks_and_frees_checkpoint_tensors():
    layer, method = _qkv()
    for shard, rows in (("q", 256), ("k", 128), ("v", 128)):
        assert cpu_int4.PACK not in dict(layer.named_parameters())
        _load(layer, shard, rows)
    # Repacked as the last tensor of the last shard came in, before vLLM's call after loading.
    names = {n for n, _ in layer.named_parameters()}
    assert names == {cpu_int4.PACK, cpu_int4.SCALES_ZEROS}
    method.process_weights_after_loading(layer)
    names = {n for n, _ in layer.named_parameters()}
    assert names == {cpu_int4.PACK, cpu_int4.SCALES_ZEROS}
    y = method.apply(layer, torch.randn(3, H).bfloat16())
    assert y.shape == (3, 512)
    if Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().find("[never]") < 0:
        assert weight_arena.huge_page_kib(getattr(layer, cpu_int4.PACK)) > 0  # the arena's


def test_missing_tensor_names_layer_and_tensor():
    layer, method = _qkv()
    _load(layer, "q", 256)
    _load(layer, "k", 128, drop=(grid.SCALE,))
    _load(layer, "v", 128)
    with pytest.raises(OmniInputError, match=r"model\.layers\.1\.self_attn\.k_proj: "
                                             r"weight_scale is missing"):
        method.process_weights_after_loading(layer)


def test_missing_shard_names_it():
    layer, method = _qkv()
    _load(layer, "q", 256)
    _load(layer, "k", 128)
    with pytest.raises(OmniInputError, match=r"model\.layers\.1\.self_attn\.v_proj: "
                                             r"weight_packed is missing"):
        method.process_weights_after_loading(layer)


def test_wrong_shape_names_layer_and_tensor():
    layer, _ = _qkv()
    with pytest.raises(OmniInputError, match=r"model\.layers\.1\.self_attn\.k_proj: "
                                             r"weight_zero has shape \(128, 4\)"):
        _load(layer, "k", 128, **{grid.ZERO: torch.zeros(128, 4, dtype=torch.bfloat16)})


def test_wrong_dtype_names_layer_and_tensor():
    layer, _ = _qkv()
    with pytest.raises(OmniInputError, match=r"model\.layers\.1\.self_attn\.q_proj: "
                                             r"weight_packed has dtype torch\.int32"):
        _load(layer, "q", 256, **{grid.PACKED: torch.zeros(256, H // 2, dtype=torch.int32)})


def test_quantized_checkpoint_with_unsupported_layer_not_ignored_is_rejected():
    config = cpu_int4.CpuInt4Config.from_config({"group_size": 128})
    layer = FakeQKV("model.layers.0.mlp.odd")
    layer.output_sizes = [24]
    method = cpu_int4.CpuInt4LinearMethod(config, "model.layers.0.mlp.odd")
    with pytest.raises(OmniInputError, match=r"model\.layers\.0\.mlp\.odd: .*N=24"):
        method.create_weights(layer, H, [24], H, 24, torch.bfloat16, weight_loader=_copy_loader)


@pytest.mark.parametrize("cfg,match", [
    ({"group_size": 96}, r"group_size: must be one of \[32, 64, 128\], got 96"),
    ({"row_threshold": -1}, r"row_threshold: must be an int >= 0, got -1"),
    ({"dequant_rows": "256"}, r"dequant_rows: must be an int >= 0, got '256'"),
    ({"ignored_modules": "lm_head"}, r"ignored_modules"),
    ({"quant_method": "awq"}, r"quant_method: expected 'cpu_int4', got 'awq'"),
    ({"grup_size": 64}, r"unknown field\(s\) \['grup_size'\]"),
    ({"activation_bits": 4}, r"activation_bits: must be one of \[16, 8\], got 4"),
    ({"activation_bits": True}, r"activation_bits: must be one of \[16, 8\], got True"),
    ({"activation_bits": 8.0}, r"activation_bits: must be one of \[16, 8\], got 8.0"),
])
def test_config_errors_name_the_field(cfg, match):
    with pytest.raises(OmniInputError, match=match):
        cpu_int4.CpuInt4Config.from_config(cfg)


def test_config_round_trip_and_defaults():
    d = {"quant_method": "cpu_int4", "group_size": 64, "ignored_modules": ["lm_head"],
         "row_threshold": 7}
    c = cpu_int4.CpuInt4Config.from_config(d)
    assert c.to_dict() == d and c.checkpoint_quantized
    at_load = cpu_int4.CpuInt4Config()
    assert not at_load.checkpoint_quantized and at_load.get_config_filenames() == []
    assert at_load.row_threshold == cpu_int4.default_row_threshold()
    assert "row_threshold" not in at_load.to_dict()  # each CPU takes its own


@pytest.mark.parametrize("kernel_set,want,dequant", [
    ("amx", 16, cpu_int4.DEQUANT_ROWS_BY_SET["amx"]),
    ("avx512bf16", 32, cpu_int4.DEQUANT_ROWS_BY_SET["avx512bf16"]), ("avx512", 32, 0),
    ("avx2", 32, 0), ("portable", 32, 0), ("python", 32, 0)])
def test_a_config_without_row_threshold_takes_the_kernel_sets(kernel_set, want, dequant,
                                                              monkeypatch):
    """The GEMM on AMX tiles overtakes the GEMV at 16 rows (results/int4_kernels/
    20261207T113929Z.json), the other sets' at 32; only where the dequantization feeds bf16
    products itself (AMX-BF16 tiles, AVX512_BF16 registers) does the bf16 product on the
    dequantized weight overtake the GEMM; a config that names a value keeps it."""
    from vllm_omni.ops import native

    monkeypatch.setattr(native, "kernel_set", lambda: kernel_set)
    for c in (cpu_int4.CpuInt4Config(), cpu_int4.CpuInt4Config.from_config({"group_size": 64}),
              cpu_int4.CpuInt4A8Config()):
        assert (c.row_threshold, c.dequant_rows) == (want, dequant)
    assert cpu_int4.CpuInt4Config(row_threshold=7).row_threshold == 7
    assert cpu_int4.CpuInt4Config.from_config({"row_threshold": 40}).row_threshold == 40
    given = cpu_int4.CpuInt4Config.from_config({"dequant_rows": 0})
    assert given.dequant_rows == 0 and given.to_dict()["dequant_rows"] == 0


def test_writing_a_config_without_row_threshold_loads_no_kernels(monkeypatch):
    """The kernel set's value is read when a layer first needs it: `omni-ray quantize` builds no
    kernel set to write a checkpoint, and the checkpoint names no threshold."""
    from vllm_omni.ops import native

    def no_kernels():
        raise AssertionError("the kernel set was loaded")

    monkeypatch.setattr(native, "kernel_set", no_kernels)
    c = cpu_int4.CpuInt4Config(group_size=64)
    assert c.to_dict() == {"quant_method": "cpu_int4", "group_size": 64, "ignored_modules": []}
    monkeypatch.setattr(native, "kernel_set", lambda: "amx")
    assert c.row_threshold == 16
    assert c.dequant_rows == cpu_int4.DEQUANT_ROWS_BY_SET["amx"]


def test_w4a8_is_a_field_and_a_method_of_its_own():
    """activation_bits is written only when it is not 16 (checkpoints written before it existed
    read the same); cpu_int4_a8 defaults to 8, at load and on a cpu_int4 checkpoint, which
    vLLM is told to read as cpu_int4_a8 (it refuses a method other than the checkpoint's)."""
    assert "activation_bits" not in cpu_int4.CpuInt4Config().to_dict()
    assert cpu_int4.CpuInt4Config().activation_bits == 16
    d = {"quant_method": "cpu_int4", "group_size": 128, "ignored_modules": [],
         "row_threshold": 32, "activation_bits": 8}
    c = cpu_int4.CpuInt4Config.from_config(d)
    assert c.activation_bits == 8 and c.to_dict() == d and c.get_name() == "cpu_int4"
    a8 = cpu_int4.CpuInt4A8Config()
    assert a8.activation_bits == 8 and a8.get_name() == "cpu_int4_a8"
    assert not a8.checkpoint_quantized
    on_ckpt = cpu_int4.CpuInt4A8Config.from_config({"quant_method": "cpu_int4", "group_size": 64})
    assert on_ckpt.activation_bits == 8 and on_ckpt.group_size == 64
    assert on_ckpt.checkpoint_quantized
    # asked for as cpu_int4_a8, a checkpoint that says 16 runs W4A8 all the same
    assert cpu_int4.CpuInt4A8Config.from_config({"activation_bits": 16}).activation_bits == 8
    over = cpu_int4.CpuInt4A8Config.override_quantization_method
    assert over({"quant_method": "cpu_int4"}, "cpu_int4_a8") == "cpu_int4_a8"
    assert over({"quant_method": "cpu_int4"}, "cpu_int4") is None
    assert over({"quant_method": "awq"}, "cpu_int4_a8") is None
    assert "activation_bits=8" in repr(a8)


def test_apply_passes_activation_bits_to_the_op(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.ops.vllm_omni, "cpu_int4_linear",
                        lambda *a: calls.append(a) or a[0], raising=False)
    layer = torch.nn.Module()
    layer.cpu_int4 = type("S", (), {"dense": False})()
    setattr(layer, cpu_int4.PACK, torch.zeros(1))
    setattr(layer, cpu_int4.SCALES_ZEROS, torch.zeros(1))
    for cfg, bits in ((cpu_int4.CpuInt4Config(), 16), (cpu_int4.CpuInt4A8Config(), 8)):
        cpu_int4.CpuInt4LinearMethod(cfg, "model.layers.0.mlp.down_proj").apply(
            layer, torch.zeros(2, 4))
        assert calls[-1][6] == bits


def test_the_threshold_is_read_when_the_method_is_made_not_in_apply(monkeypatch):
    """apply() runs inside dynamo's trace, which cannot follow the kernel set's lookup (it
    reads /proc/cpuinfo): the kernel set's values are read when vLLM makes the method."""
    from vllm_omni.ops import native

    calls = []
    monkeypatch.setattr(torch.ops.vllm_omni, "cpu_int4_linear",
                        lambda *a: calls.append(a) or a[0], raising=False)
    monkeypatch.setattr(native, "kernel_set", lambda: "amx")
    method = cpu_int4.CpuInt4LinearMethod(cpu_int4.CpuInt4Config(), "model.layers.0.mlp.up_proj")

    def no_lookup():
        raise AssertionError("the kernel set was looked up in apply()")

    monkeypatch.setattr(native, "kernel_set", no_lookup)
    layer = torch.nn.Module()
    layer.cpu_int4 = type("S", (), {"dense": False})()
    setattr(layer, cpu_int4.PACK, torch.zeros(1))
    setattr(layer, cpu_int4.SCALES_ZEROS, torch.zeros(1))
    method.apply(layer, torch.zeros(2, 4))
    assert calls[-1][4] == 16 and calls[-1][7] == cpu_int4.DEQUANT_ROWS_BY_SET["amx"]


def test_partly_ignored_fused_layer_is_rejected():
    c = cpu_int4.CpuInt4Config.from_config({"ignored_modules": ["model.layers.0.mlp.up_proj"]})
    c.packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}
    with pytest.raises(OmniInputError, match=r"model\.layers\.0\.mlp\.gate_up_proj"):
        c.is_ignored("model.layers.0.mlp.gate_up_proj")
    c.ignored_modules.append("model.layers.0.mlp.gate_proj")
    assert c.is_ignored("model.layers.0.mlp.gate_up_proj")


def test_register_is_idempotent_and_uses_weight_loader_v2():
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.quantization import get_quantization_config

    cpu_int4.register()
    cpu_int4.register()
    assert cpu_int4.is_registered()
    assert get_quantization_config("cpu_int4") is cpu_int4.CpuInt4Config
    assert get_quantization_config("cpu_int4_a8") is cpu_int4.CpuInt4A8Config
    assert linear.WEIGHT_LOADER_V2_SUPPORTED.count("CpuInt4LinearMethod") == 1


def test_config_pickles():
    import pickle

    c = cpu_int4.CpuInt4Config.from_config({"group_size": 32, "row_threshold": 9})
    assert pickle.loads(pickle.dumps(c)).to_dict() == c.to_dict()


def _at_load_qkv():
    """A fused layer of a bf16 checkpoint, quantized at load (``LLM(quantization="cpu_int4")``)."""
    config = cpu_int4.CpuInt4Config(group_size=128)
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    layer = FakeQKV("model.layers.1.self_attn.qkv_proj")
    method = cpu_int4.CpuInt4LinearMethod(config, layer.prefix)
    method.create_weights(layer, H, [256, 128, 128], H, 512, torch.bfloat16,
                          weight_loader=_copy_loader)
    return layer, method


def test_at_load_each_weight_is_packed_once_its_last_shard_is_in_and_its_bf16_freed():
    torch.manual_seed(0)
    w = {"q": torch.randn(256, H).bfloat16(), "k": torch.randn(128, H).bfloat16(),
         "v": torch.randn(128, H).bfloat16()}
    layer, method = _at_load_qkv()
    bf16 = layer.weight  # what the model's load_weights holds in its params_dict
    for shard in ("q", "k"):
        bf16.weight_loader(bf16, w[shard], shard)
        assert "weight" in dict(layer.named_parameters())  # a shard is missing: still bf16
    bf16.weight_loader(bf16, w["v"], "v")
    names = {n for n, _ in layer.named_parameters()}
    assert names == {cpu_int4.PACK, cpu_int4.SCALES_ZEROS}
    assert bf16.numel() == 0  # its storage is gone although the Parameter object lives on
    method.process_weights_after_loading(layer)  # vLLM's call after loading changes nothing
    packed = getattr(layer, cpu_int4.PACK)

    # The same weight quantized after loading (the path before): the very same bytes.
    ref, ref_method = _at_load_qkv()
    full = torch.cat([w["q"], w["k"], w["v"]])
    ref.weight.data.copy_(full)  # filled behind the loader's back: packed only after loading
    ref.cpu_int4.loaded |= {("weight", s) for s in ref.cpu_int4.shards}
    ref_method.process_weights_after_loading(ref)
    assert torch.equal(getattr(ref, cpu_int4.PACK), packed)
    assert torch.equal(getattr(ref, cpu_int4.SCALES_ZEROS), getattr(layer, cpu_int4.SCALES_ZEROS))
    x = torch.randn(3, H).bfloat16()
    expect = x.float() @ grid.dequantize(grid.quantize(full, 128)).float().T
    torch.testing.assert_close(method.apply(layer, x).float(), expect, atol=0.1, rtol=0.02)


def test_at_load_missing_shard_is_named_after_loading():
    layer, method = _at_load_qkv()
    for shard, rows in (("q", 256), ("v", 128)):
        layer.weight.weight_loader(layer.weight, torch.randn(rows, H).bfloat16(), shard)
    with pytest.raises(OmniInputError, match=r"k_proj: weight is missing"):
        method.process_weights_after_loading(layer)


class FakeRowLinear(torch.nn.Module):
    """What the method reads from a one-tensor layer (o_proj, down_proj)."""

    def __init__(self, prefix):
        super().__init__()
        self.prefix, self.input_size, self.output_size = prefix, H, 384


def test_at_load_a_whole_weight_is_packed_from_the_checkpoint_tensor_itself():
    config = cpu_int4.CpuInt4Config(group_size=128)
    layer = FakeRowLinear("model.layers.0.self_attn.o_proj")
    method = cpu_int4.CpuInt4LinearMethod(config, layer.prefix)
    copies = []
    method.create_weights(layer, H, [384], H, 384, torch.bfloat16,
                          weight_loader=lambda p, w: copies.append(p.data.copy_(w)))
    bf16 = layer.weight
    w = torch.randn(384, H).bfloat16()
    bf16.weight_loader(bf16, w)
    assert copies == []  # the bf16 parameter was never written
    assert {n for n, _ in layer.named_parameters()} == {cpu_int4.PACK, cpu_int4.SCALES_ZEROS}
    assert bf16.numel() == 0
    method.process_weights_after_loading(layer)
    x = torch.randn(2, H).bfloat16()
    expect = x.float() @ grid.dequantize(grid.quantize(w, 128)).float().T
    torch.testing.assert_close(method.apply(layer, x).float(), expect, atol=0.1, rtol=0.02)

    # A float32 checkpoint tensor goes through the parameter (rounded to bf16 first).
    layer = FakeRowLinear("model.layers.0.self_attn.o_proj")
    method = cpu_int4.CpuInt4LinearMethod(config, layer.prefix)
    method.create_weights(layer, H, [384], H, 384, torch.bfloat16,
                          weight_loader=lambda p, w: copies.append(p.data.copy_(w)))
    layer.weight.weight_loader(layer.weight, w.float())
    assert len(copies) == 1 and cpu_int4.PACK in dict(layer.named_parameters())


def test_at_load_a_layer_int4_cannot_take_stays_bf16_and_computes():
    config = cpu_int4.CpuInt4Config(group_size=128)
    layer = FakeRowLinear("model.layers.0.self_attn.o_proj")
    layer.input_size = 200  # not a multiple of the group
    method = cpu_int4.CpuInt4LinearMethod(config, layer.prefix)
    method.create_weights(layer, 200, [384], 200, 384, torch.bfloat16,
                          weight_loader=lambda p, w: p.data.copy_(w))
    w = torch.randn(384, 200).bfloat16()
    layer.weight.weight_loader(layer.weight, w)
    method.process_weights_after_loading(layer)
    assert layer.cpu_int4.dense and torch.equal(layer.weight, w)
    x = torch.randn(2, 200).bfloat16()
    torch.testing.assert_close(method.apply(layer, x), torch.nn.functional.linear(x, w))
