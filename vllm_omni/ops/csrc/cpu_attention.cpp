// C++ kernels for vLLM's two per-layer attention ops on CPU, for the cpu_attention patch
// (vllm_omni/patches/cpu_attention.py, which says why and what they reproduce).
//
// vllm::unified_kv_cache_update(key, value, layer_name) and
// vllm::unified_attention_with_output(query, key, value, output, layer_name, ...) are Python
// functions in vLLM; every layer of every decode step calls both, so a 24-layer model runs 48
// Python calls a step only to find the layer, its cache views and the step's metadata before
// calling vLLM's kernels (torch.ops._C.cpu_attn_reshape_and_cache and
// cpu_attention_with_kv_cache). Here those lookups are a hash-map find:
//
// - per layer, once (and again if its kv_cache tensor changes), Python registers what does not
//   change: the K and V views of the cache, the ISA, the scales, the window, ALiBi and sinks;
// - per forward, on the first op call that sees a new forward context, the kernel calls back
//   into Python (``sync(ctx) -> bool``), which pushes the step's metadata once per metadata group
//   and says which layers take the short path;
// - every call then needs only the GIL for a read of ``vllm.forward_context._forward_context``
//   (a new context means a new step) and calls vLLM's kernel through the dispatcher;
// - inside GPUModelRunner._model_forward, which the patch wraps, not even that: the wrapper
//   pushes the step's metadata before the forward (``arm``, the GIL already held there), so the
//   ops read only the state here until ``disarm`` after it.
//
// A call the short path does not cover (no context, a layer sync left out, output
// quantization) goes to vLLM's own Python function, which the patch hands over at install.
// The library holds the ops' CPU kernels while ``install`` is in effect; ``uninstall`` gives them
// back to the kernels registered before (vLLM's, or the patch's Python short path).

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>
#include <torch/library.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

struct Layer {
  at::Tensor key_cache, value_cache;
  std::string isa, kv_cache_dtype;
  double k_scale = 1.0, v_scale = 1.0, scale = 1.0, softcap = 0.0;
  std::optional<at::Tensor> alibi_slopes, sinks;
  int64_t sliding_window = -1;
  int64_t group = -1;  // the current step's metadata group, -1: not on the short path
  bool direct_update = false;  // the cache layout is one direct_cache_update writes
};

struct Group {
  std::optional<at::Tensor> slot_mapping;  // none: the cache update writes nothing
  bool has_metadata = false;               // false (warm-up): attention computes nothing
  int64_t num_actual_tokens = 0;
  at::Tensor query_start_loc, seq_lens, block_table, scheduler_metadata;
  std::optional<at::Tensor> dynamic_causal;
  bool causal = true;
};

struct State {
  std::unordered_map<std::string, Layer> layers;
  std::vector<Group> groups;
  py::object module;  // vllm.forward_context
  py::object sync, stock_update, stock_attention;
  // Identity of what the groups were built from; a change means a new step.
  py::object context, metadata, slots;
  bool step_ok = false;
  // Set by arm() (from Python, before the model's forward, the step's metadata pushed) until
  // disarm(): the ops then read only this state and never take the GIL.
  bool armed = false;
  bool direct_update_enabled = true;  // set_direct_update(false) keeps vLLM's kernel
  int64_t armed_calls = 0;  // op calls served while armed, since install
  std::unique_ptr<torch::Library> lib;
  // vLLM's kernels, called boxed: that needs no knowledge of the C++ types they were
  // registered with, only of their schemas (checked by the patch's fingerprints).
  std::optional<c10::OperatorHandle> reshape_and_cache, attention;
};

State* g_state = nullptr;  // lives from the first install to process exit

// --------------------------------------------------------------------------- cache update
//
// vLLM's cpu_attn_reshape_and_cache opens an OpenMP region to copy one token's K and V rows per
// KV head in a decode step. With the "vec" layout (vLLM's csrc/cpu/cpu_attn_vec.hpp) and an
// unquantized cache the copy is all it does: per block and KV head, K is stored [head_dim,
// block_size] (a token's K is a column) and V [block_size, head_dim]; key_cache and value_cache
// are the two halves' views, with the same strides. direct_cache_update makes the same copy on
// the calling thread. tests/integration/test_compat.py checks the bytes against vLLM's kernel.

bool vec_layout(const Layer& l) {
  return l.isa == "vec" && l.kv_cache_dtype == "auto" && l.key_cache.dim() == 4 &&
         l.key_cache.stride(3) == 1 && l.key_cache.stride(2) == l.key_cache.size(3) &&
         l.value_cache.strides() == l.key_cache.strides() &&
         l.value_cache.sizes() == l.key_cache.sizes() &&
         l.value_cache.scalar_type() == l.key_cache.scalar_type();
}

// Whether the call's tensors are what direct_cache_update reads (vLLM's kernel checks the same
// unit strides and takes the token count from key).
bool direct_update_call(const at::Tensor& key, const at::Tensor& value, const Layer& l,
                        const at::Tensor& slots) {
  return key.scalar_type() == l.key_cache.scalar_type() &&
         value.scalar_type() == key.scalar_type() && key.dim() == 3 && value.dim() == 3 &&
         key.stride(2) == 1 && value.stride(2) == 1 && key.size(1) == l.key_cache.size(1) &&
         key.size(2) == l.key_cache.size(3) && value.sizes() == key.sizes() &&
         slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.size(0) >= key.size(0) &&
         slots.is_contiguous() && (key.element_size() == 2 || key.element_size() == 4);
}

template <typename T>
void copy_rows(const at::Tensor& key, const at::Tensor& value, const Layer& l,
               const at::Tensor& slots) {
  const int64_t tokens = key.size(0), kv_heads = key.size(1), D = key.size(2);
  const int64_t block_size = l.key_cache.size(2);
  const int64_t block_stride = l.key_cache.stride(0), head_stride = l.key_cache.stride(1);
  const T* k = static_cast<const T*>(key.data_ptr());
  const T* v = static_cast<const T*>(value.data_ptr());
  T* kc = static_cast<T*>(l.key_cache.data_ptr());
  T* vc = static_cast<T*>(l.value_cache.data_ptr());
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    if (slot[t] < 0) continue;  // padding: vLLM skips it too
    const int64_t b = slot[t] / block_size, o = slot[t] % block_size;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const T* ks = k + t * key.stride(0) + h * key.stride(1);
      T* kd = kc + b * block_stride + h * head_stride + o;
      for (int64_t d = 0; d < D; ++d) kd[d * block_size] = ks[d];
      std::memcpy(vc + b * block_stride + h * head_stride + o * D,
                  v + t * value.stride(0) + h * value.stride(1), D * sizeof(T));
    }
  }
}

void direct_cache_update(const at::Tensor& key, const at::Tensor& value, const Layer& l,
                         const at::Tensor& slots) {
  if (key.element_size() == 2)
    copy_rows<uint16_t>(key, value, l, slots);
  else
    copy_rows<uint32_t>(key, value, l, slots);
}

// A new step's identity recorded and its metadata pushed (GIL held); sets step_ok.
void resync(State& s, py::object ctx, py::object metadata, py::object slots) {
  s.step_ok = false;  // stays so if sync raises: the rest of the step goes to vLLM's code
  s.context = ctx;
  s.metadata = std::move(metadata);
  s.slots = std::move(slots);
  s.step_ok = s.sync(ctx).cast<bool>();
}

// The layer when this step's metadata put it on the short path, else nullptr.
Layer* step_layer(State& s, c10::string_view name) {
  auto it = s.layers.find(std::string(name));
  return it == s.layers.end() || it->second.group < 0 ? nullptr : &it->second;
}

// The layer when this call takes the short path, else nullptr. Holds the GIL only for the
// context check (and, once a step, the sync callback); not at all while armed.
Layer* short_path_layer(c10::string_view name) {
  State& s = *g_state;
  if (s.armed) {
    Layer* layer = step_layer(s, name);
    s.armed_calls += layer != nullptr;
    return layer;
  }
  py::gil_scoped_acquire gil;
  py::object ctx = s.module.attr("_forward_context");
  if (ctx.is_none()) return nullptr;
  py::object metadata = ctx.attr("attn_metadata");
  py::object slots = ctx.attr("slot_mapping");
  if (!ctx.is(s.context) || !metadata.is(s.metadata) || !slots.is(s.slots))
    resync(s, ctx, metadata, slots);
  return s.step_ok ? step_layer(s, name) : nullptr;
}

at::Tensor unified_kv_cache_update(const at::Tensor& key, const at::Tensor& value,
                                   c10::string_view layer_name) {
  Layer* layer = short_path_layer(layer_name);
  if (layer == nullptr) {
    py::gil_scoped_acquire gil;
    return g_state->stock_update(key, value, std::string(layer_name)).cast<at::Tensor>();
  }
  const Group& grp = g_state->groups[layer->group];
  if (grp.slot_mapping && layer->direct_update && g_state->direct_update_enabled &&
      direct_update_call(key, value, *layer, *grp.slot_mapping)) {
    direct_cache_update(key, value, *layer, *grp.slot_mapping);
  } else if (grp.slot_mapping) {
    torch::jit::Stack stack{key, value, layer->key_cache, layer->value_cache,
                            *grp.slot_mapping, layer->isa, layer->k_scale, layer->v_scale,
                            layer->kv_cache_dtype};
    g_state->reshape_and_cache->callBoxed(stack);
  }
  return key.new_empty({0});
}

void unified_attention_with_output(const at::Tensor& query, const at::Tensor& key,
                                   const at::Tensor& value, const at::Tensor& output,
                                   c10::string_view layer_name,
                                   const std::optional<at::Tensor>& output_scale,
                                   const std::optional<at::Tensor>& output_block_scale,
                                   const std::optional<at::Tensor>& kv_cache_dummy_dep) {
  Layer* layer = output_scale || output_block_scale ? nullptr : short_path_layer(layer_name);
  if (layer == nullptr) {
    py::gil_scoped_acquire gil;
    g_state->stock_attention(query, key, value, output, std::string(layer_name), output_scale,
                             output_block_scale, kv_cache_dummy_dep);
    return;
  }
  const Group& grp = g_state->groups[layer->group];
  if (!grp.has_metadata) return;  // warm-up
  const int64_t n = grp.num_actual_tokens;
  torch::jit::Stack stack{
      query.size(0) == n ? query : query.narrow(0, 0, n), layer->key_cache, layer->value_cache,
      output.size(0) == n ? output : output.narrow(0, 0, n), grp.query_start_loc, grp.seq_lens,
      layer->scale, grp.causal, layer->alibi_slopes, layer->sliding_window, grp.block_table,
      layer->softcap, grp.scheduler_metadata, layer->sinks, grp.dynamic_causal, layer->k_scale,
      layer->v_scale, layer->kv_cache_dtype};
  g_state->attention->callBoxed(stack);
}

// --------------------------------------------------------------------------- Python side

void install(py::object forward_context_module, py::object sync, py::object stock_update,
             py::object stock_attention) {
  if (g_state == nullptr) g_state = new State();
  State& s = *g_state;
  auto& dispatcher = c10::Dispatcher::singleton();
  s.reshape_and_cache = dispatcher.findSchemaOrThrow("_C::cpu_attn_reshape_and_cache", "");
  s.attention = dispatcher.findSchemaOrThrow("_C::cpu_attention_with_kv_cache", "");
  s.module = forward_context_module;
  s.sync = sync;
  s.stock_update = stock_update;
  s.stock_attention = stock_attention;
  s.context = s.metadata = s.slots = py::none();
  s.armed_calls = 0;
  if (!s.lib) {
    s.lib = std::make_unique<torch::Library>(torch::Library::IMPL, "vllm",
                                             c10::DispatchKey::CPU, __FILE__, __LINE__);
    s.lib->impl("unified_kv_cache_update", TORCH_FN(unified_kv_cache_update));
    s.lib->impl("unified_attention_with_output", TORCH_FN(unified_attention_with_output));
  }
}

void uninstall() {
  if (g_state == nullptr) return;
  g_state->armed = false;
  g_state->lib.reset();  // drops this library's kernels; the earlier ones serve again
  g_state->layers.clear();
  g_state->groups.clear();
  g_state->context = g_state->metadata = g_state->slots = py::none();
}

bool installed() { return g_state != nullptr && g_state->lib != nullptr; }

void set_layer(const std::string& name, at::Tensor key_cache, at::Tensor value_cache,
               std::string isa, double k_scale, double v_scale, std::string kv_cache_dtype,
               double scale, std::optional<at::Tensor> alibi_slopes, int64_t sliding_window,
               double softcap, std::optional<at::Tensor> sinks) {
  Layer& l = g_state->layers[name];
  l.key_cache = std::move(key_cache);
  l.value_cache = std::move(value_cache);
  l.isa = std::move(isa);
  l.k_scale = k_scale;
  l.v_scale = v_scale;
  l.kv_cache_dtype = std::move(kv_cache_dtype);
  l.scale = scale;
  l.alibi_slopes = std::move(alibi_slopes);
  l.sliding_window = sliding_window;
  l.softcap = softcap;
  l.sinks = std::move(sinks);
  l.direct_update = vec_layout(l);
}

// Whether cache updates may be copied here (true after install); false keeps vLLM's kernel.
void set_direct_update(bool enabled) { g_state->direct_update_enabled = enabled; }

// direct_cache_update on given tensors, as vLLM's cpu_attn_reshape_and_cache(..., "vec") takes
// them (tests compare the two). False: the call is not one it serves, nothing was written.
bool direct_update(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                   const at::Tensor& value_cache, const at::Tensor& slots) {
  Layer l;
  l.key_cache = key_cache;
  l.value_cache = value_cache;
  l.isa = "vec";
  l.kv_cache_dtype = "auto";
  if (!vec_layout(l) || !direct_update_call(key, value, l, slots)) return false;
  direct_cache_update(key, value, l, slots);
  return true;
}

// Before the model's forward (GIL held): push the step's metadata now, so that the ops of this
// forward need no Python at all. Returns whether the short path serves this forward.
bool arm(py::object ctx) {
  State& s = *g_state;
  s.armed = false;
  resync(s, ctx, ctx.attr("attn_metadata"), ctx.attr("slot_mapping"));
  s.armed = s.step_ok;
  return s.armed;
}

// After the forward: the ops check the forward context again (through the GIL) until arm().
void disarm() { g_state->armed = false; }

int64_t armed_calls() { return g_state == nullptr ? 0 : g_state->armed_calls; }

// A new step: no layer is on the short path until set_group names it.
void begin_step() {
  for (auto& kv : g_state->layers) kv.second.group = -1;
  g_state->groups.clear();
}

// One metadata group of the step and the layers that use it; returns the group's index.
int64_t add_group(const std::vector<std::string>& layer_names,
                  std::optional<at::Tensor> slot_mapping, bool has_metadata,
                  int64_t num_actual_tokens, std::optional<at::Tensor> query_start_loc,
                  std::optional<at::Tensor> seq_lens, std::optional<at::Tensor> block_table,
                  std::optional<at::Tensor> scheduler_metadata, bool causal,
                  std::optional<at::Tensor> dynamic_causal) {
  State& s = *g_state;
  Group grp;
  grp.slot_mapping = std::move(slot_mapping);
  grp.has_metadata = has_metadata;
  if (has_metadata) {
    TORCH_CHECK(query_start_loc && seq_lens && block_table && scheduler_metadata,
                "add_group: metadata tensors missing");
    grp.num_actual_tokens = num_actual_tokens;
    grp.query_start_loc = *query_start_loc;
    grp.seq_lens = *seq_lens;
    grp.block_table = *block_table;
    grp.scheduler_metadata = *scheduler_metadata;
    grp.causal = causal;
    grp.dynamic_causal = std::move(dynamic_causal);
  }
  const int64_t index = static_cast<int64_t>(s.groups.size());
  s.groups.push_back(std::move(grp));
  for (const auto& name : layer_names) {
    auto it = s.layers.find(name);
    TORCH_CHECK(it != s.layers.end(), "add_group: layer ", name, " was never registered");
    it->second.group = index;
  }
  return index;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("uninstall", &uninstall);
  m.def("installed", &installed);
  m.def("set_layer", &set_layer);
  m.def("begin_step", &begin_step);
  m.def("add_group", &add_group);
  m.def("arm", &arm);
  m.def("disarm", &disarm);
  m.def("armed_calls", &armed_calls);
  m.def("set_direct_update", &set_direct_update);
  m.def("direct_update", &direct_update);
}
