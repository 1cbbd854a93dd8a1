// Exact attention through cuDNN's fused SDPA forward (cuDNN frontend graph
// API). Building a cuDNN graph (heuristics, engine compilation) costs
// milliseconds to seconds, so each distinct problem — sizes, strides, scale,
// whether the LSE is wanted, device — is built once and its plan kept in a
// process-wide cache; a refusal is cached too, with its reason, so the ops
// layer's fallback decision costs nothing the second time. The cache and the
// per-device cuDNN handles sit behind one mutex: building holds it, executing
// holds it only to set the stream and enqueue.
#if TURBODIFF_HAVE_CUDNN

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "kernels/attention/attention.h"

namespace td::kernels {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the graph's inputs and outputs, the variant pack's keys.
enum : int64_t { kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidStats = 5 };

using PlanKey = std::array<int64_t, 22>;

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string refusal;  // non-empty: cuDNN does not serve this problem, and why
};

struct CudnnState {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;  // one per device, created on first use
  std::map<PlanKey, std::shared_ptr<Plan>> plans;
};

// Never destroyed: plans and handles may be used from other static destructors'
// threads, and the driver releases everything at exit anyway.
CudnnState& state() {
  static CudnnState* s = new CudnnState;
  return *s;
}

PlanKey make_key(const AttnProblem& p, bool with_lse, int device) {
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &p.scale, 4);
  return {device, p.batch, p.heads, p.len_q, p.len_kv, p.head_dim,
          p.q.batch, p.q.head, p.q.token, p.k.batch, p.k.head, p.k.token,
          p.v.batch, p.v.head, p.v.token, p.o.batch, p.o.head, p.o.token,
          int64_t(scale_bits), with_lse ? 1 : 0, int64_t(p.qkv_type), int64_t(p.o_type)};
}

std::vector<int64_t> strides_of(const AttnStrides& s) { return {s.batch, s.head, s.token, 1}; }

// Builds the SDPA graph for `p`; on refusal returns a Plan with `refusal` set.
std::shared_ptr<Plan> build_plan(const AttnProblem& p, bool with_lse, cudnnHandle_t handle) {
  auto plan = std::make_shared<Plan>();
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t uid, int64_t len, const AttnStrides& s) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({p.batch, p.heads, len, p.head_dim})
                             .set_stride(strides_of(s)));
  };
  auto q = tensor("Q", kUidQ, p.len_q, p.q);
  auto k = tensor("K", kUidK, p.len_kv, p.k);
  auto v = tensor("V", kUidV, p.len_kv, p.v);
  auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(with_lse).set_attn_scale(
      p.scale);
  auto [o, stats] = graph->sdpa(q, k, v, options);
  o->set_output(true).set_uid(kUidO).set_dim({p.batch, p.heads, p.len_q, p.head_dim}).set_stride(strides_of(p.o));
  if (with_lse)
    stats->set_output(true)
        .set_uid(kUidStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({p.batch, p.heads, p.len_q, 1})
        .set_stride({p.heads * p.len_q, p.len_q, 1, 1});

  if (auto e = graph->build(handle, {fe::HeurMode_t::A}); e.is_bad()) {
    plan->refusal = "cuDNN does not build this SDPA graph: " + e.get_message();
    return plan;
  }
  if (auto e = graph->get_workspace_size(plan->workspace); e.is_bad()) {
    plan->refusal = "cuDNN workspace query failed: " + e.get_message();
    return plan;
  }
  plan->graph = std::move(graph);
  return plan;
}

std::string problem_str(const AttnProblem& p, bool with_lse) {
  return "B=" + std::to_string(p.batch) + " H=" + std::to_string(p.heads) + " Lq=" + std::to_string(p.len_q) +
         " Lk=" + std::to_string(p.len_kv) + " D=" + std::to_string(p.head_dim) + (with_lse ? " +LSE" : "");
}

// The cached plan for `p` on the current device, building it (and the device's
// handle) on first use. Called with the state mutex held.
Status get_plan(const AttnProblem& p, bool with_lse, std::shared_ptr<Plan>* out, cudnnHandle_t* handle_out) {
  using detail::attn_fail;
  if (Status s = attention_check(p); s != Status::Ok) return s;
  if (p.qkv_type != ElemType::BF16 || p.o_type != ElemType::BF16)
    return attn_fail(Status::Unsupported, "attention_cudnn: takes bf16 Q/K/V and O only");
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return attn_fail(Status::Unsupported, std::string("attention_cudnn: no current CUDA device: ") +
                                              cudaGetErrorString(e));
  CudnnState& st = state();
  auto h = st.handles.find(device);
  if (h == st.handles.end()) {
    cudnnHandle_t handle = nullptr;
    if (cudnnStatus_t s = cudnnCreate(&handle); s != CUDNN_STATUS_SUCCESS)
      return attn_fail(Status::Unsupported, "attention_cudnn: cudnnCreate on device " + std::to_string(device) +
                                                " failed: " + cudnnGetErrorString(s));
    h = st.handles.emplace(device, handle).first;
  }
  const PlanKey key = make_key(p, with_lse, device);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) it = st.plans.emplace(key, build_plan(p, with_lse, h->second)).first;
  if (!it->second->refusal.empty())
    return attn_fail(Status::Unsupported, "attention_cudnn (" + problem_str(p, with_lse) + "): " + it->second->refusal);
  *out = it->second;
  *handle_out = h->second;
  return Status::Ok;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

Status attention_cudnn_workspace_size(const AttnProblem& p, bool with_lse, size_t* bytes) {
  if (!bytes) return detail::attn_fail(Status::InvalidArgument, "attention_cudnn_workspace_size: null output pointer");
  std::lock_guard<std::mutex> lock(state().mu);
  std::shared_ptr<Plan> plan;
  cudnnHandle_t handle = nullptr;
  if (Status s = get_plan(p, with_lse, &plan, &handle); s != Status::Ok) return s;
  *bytes = size_t(plan->workspace);
  detail::attn_clear_error();
  return Status::Ok;
}

Status attention_cudnn(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                       void* workspace, size_t workspace_bytes, void* stream) {
  using detail::attn_fail;
  if (!q || !k || !v || !o)
    return attn_fail(Status::InvalidArgument,
                     std::string("attention_cudnn: null pointer for ") + (!q ? "Q" : !k ? "K" : !v ? "V" : "O"));
  // The plan is built for 16-byte aligned rows; an unaligned base would break it.
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(o) || (lse && !aligned16(lse)))
    return attn_fail(Status::Unsupported, "attention_cudnn: Q, K, V, O and LSE must be 16-byte aligned");
  std::lock_guard<std::mutex> lock(state().mu);
  std::shared_ptr<Plan> plan;
  cudnnHandle_t handle = nullptr;
  if (Status s = get_plan(p, lse != nullptr, &plan, &handle); s != Status::Ok) return s;
  if (workspace_bytes < size_t(plan->workspace) || (plan->workspace > 0 && !workspace))
    return attn_fail(Status::InvalidArgument, "attention_cudnn: the plan needs " + std::to_string(plan->workspace) +
                                                  " bytes of workspace, got " + std::to_string(workspace_bytes));
  if (cudnnStatus_t s = cudnnSetStream(handle, static_cast<cudaStream_t>(stream)); s != CUDNN_STATUS_SUCCESS)
    return attn_fail(Status::LaunchFailed, std::string("attention_cudnn: cudnnSetStream failed: ") +
                                               cudnnGetErrorString(s));
  std::unordered_map<int64_t, void*> pack = {{kUidQ, const_cast<void*>(q)},
                                             {kUidK, const_cast<void*>(k)},
                                             {kUidV, const_cast<void*>(v)},
                                             {kUidO, o}};
  if (lse) pack.emplace(kUidStats, lse);
  if (auto e = plan->graph->execute(handle, pack, workspace); e.is_bad())
    return attn_fail(Status::LaunchFailed, "attention_cudnn (" + problem_str(p, lse != nullptr) +
                                               "): execution failed: " + e.get_message());
  detail::attn_clear_error();
  return Status::Ok;
}

size_t attention_cudnn_cached_plans() {
  std::lock_guard<std::mutex> lock(state().mu);
  size_t n = 0;
  for (const auto& [key, plan] : state().plans) n += plan->graph != nullptr;
  return n;
}

}  // namespace td::kernels

#endif  // TURBODIFF_HAVE_CUDNN
