// The VAE's convolutions on CUDA through a cuDNN frontend fprop graph
// (contract in conv.h). Channels-last tensors (NDHWC strides on cuDNN's
// [n, c, d, h, w] dims: the layout its BF16 tensor-core engines want), fp32
// compute, the bias as a fused pointwise add on the fp32 accumulator. Plans
// are cached per problem and device the way attention_cudnn.cpp does it: a
// build (heuristics, precompiled engines first) costs milliseconds; a refusal is
// cached with its reason so the ops layer's fallback (unfused bias) costs
// nothing the second time. One mutex guards the handles and the cache.
#if TURBODIFF_HAVE_CUDNN

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "kernels/conv/conv.h"

namespace td::kernels {
namespace {

namespace fe = cudnn_frontend;

enum : int64_t { kUidX = 1, kUidW = 2, kUidB = 3, kUidY = 4 };

using PlanKey = std::array<int64_t, 19>;

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string refusal;
};

struct State {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;
  std::map<PlanKey, std::shared_ptr<Plan>> plans;
};

State& state() {
  static State* s = new State;  // never destroyed (see attention_cudnn.cpp)
  return *s;
}

thread_local std::string t_error;

Status fail(Status s, std::string why) {
  t_error = std::move(why);
  return s;
}

PlanKey make_key(const ConvCudnnProblem& p, int device) {
  return {device,     p.n,        p.cin,      p.t,       p.h,          p.w,        p.cout,
          p.kt,       p.kh,       p.kw,       p.stride_t, p.stride_h,  p.stride_w, p.pad_top,
          p.pad_bottom, p.pad_left, p.pad_right, p.bias ? 1 : 0, int64_t(p.type)};
}

int64_t out_t(const ConvCudnnProblem& p) { return conv_out_size(p.t, p.kt, p.stride_t, 0, 0); }
int64_t out_h(const ConvCudnnProblem& p) { return conv_out_size(p.h, p.kh, p.stride_h, p.pad_top, p.pad_bottom); }
int64_t out_w(const ConvCudnnProblem& p) { return conv_out_size(p.w, p.kw, p.stride_w, p.pad_left, p.pad_right); }

std::string problem_str(const ConvCudnnProblem& p) {
  const auto s = [](int64_t v) { return std::to_string(v); };
  return "x [" + s(p.n) + ", " + s(p.t) + ", " + s(p.h) + ", " + s(p.w) + ", " + s(p.cin) + "] w [" + s(p.cout) +
         ", " + s(p.kt) + ", " + s(p.kh) + ", " + s(p.kw) + ", " + s(p.cin) + "] stride " + s(p.stride_t) + "/" +
         s(p.stride_h) + "/" + s(p.stride_w) + " pad " + s(p.pad_top) + "," + s(p.pad_bottom) + "," +
         s(p.pad_left) + "," + s(p.pad_right) + (p.bias ? " +bias" : "") +
         (p.type == ElemType::BF16 ? " bf16" : " f32");
}

// Channels-last strides of [n, c, d, h, w] dims.
std::vector<int64_t> cl_strides(int64_t c, int64_t d, int64_t h, int64_t w) { return {d * h * w * c, 1, h * w * c, w * c, c}; }

std::shared_ptr<Plan> build_plan(const ConvCudnnProblem& p, cudnnHandle_t handle, bool allow_runtime_compilation) {
  auto plan = std::make_shared<Plan>();
  auto graph = std::make_shared<fe::graph::Graph>();
  const fe::DataType_t io = p.type == ElemType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::FLOAT;
  graph->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto x = graph->tensor(fe::graph::Tensor_attributes()
                             .set_name("x")
                             .set_uid(kUidX)
                             .set_dim({p.n, p.cin, p.t, p.h, p.w})
                             .set_stride(cl_strides(p.cin, p.t, p.h, p.w)));
  auto wt = graph->tensor(fe::graph::Tensor_attributes()
                              .set_name("w")
                              .set_uid(kUidW)
                              .set_dim({p.cout, p.cin, p.kt, p.kh, p.kw})
                              .set_stride(cl_strides(p.cin, p.kt, p.kh, p.kw)));
  auto conv = fe::graph::Conv_fprop_attributes()
                  .set_name("conv")
                  .set_pre_padding({0, p.pad_top, p.pad_left})
                  .set_post_padding({0, p.pad_bottom, p.pad_right})
                  .set_stride({p.stride_t, p.stride_h, p.stride_w})
                  .set_dilation({1, 1, 1});
  auto y = graph->conv_fprop(x, wt, conv);
  const int64_t ot = out_t(p), oh = out_h(p), ow = out_w(p);
  const std::vector<int64_t> ydim = {p.n, p.cout, ot, oh, ow}, ystride = cl_strides(p.cout, ot, oh, ow);
  if (p.bias) {
    y->set_data_type(fe::DataType_t::FLOAT).set_dim(ydim).set_stride(ystride);
    auto b = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("bias")
                               .set_uid(kUidB)
                               .set_data_type(fe::DataType_t::FLOAT)
                               .set_dim({1, p.cout, 1, 1, 1})
                               .set_stride({p.cout, 1, p.cout, p.cout, p.cout}));
    auto add = graph->pointwise(y, b, fe::graph::Pointwise_attributes().set_name("bias").set_mode(
                                          fe::PointwiseMode_t::ADD));
    add->set_output(true).set_uid(kUidY).set_data_type(io).set_dim(ydim).set_stride(ystride);
  } else {
    y->set_output(true).set_uid(kUidY).set_data_type(io).set_dim(ydim).set_stride(ystride);
  }
  // The steps of graph->build(), with engines that compile their kernels at
  // run time (NVRTC, about a second per shape: 40 s for the shapes of one
  // 480p decode on the H200) left out unless nothing else takes the graph.
  fe::error_t e = graph->validate();
  if (e.is_good()) e = graph->build_operation_graph(handle);
  if (e.is_good()) e = graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (e.is_good() && !allow_runtime_compilation) graph->deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  if (e.is_good()) e = graph->check_support();
  if (e.is_good()) e = graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
  if (e.is_bad()) {
    // A conv+bias graph without a precompiled engine is refused, so that the
    // ops layer runs the convolution and the bias add apart (precompiled,
    // an extra pass over the output) rather than compile one per shape.
    if (!allow_runtime_compilation && !p.bias) return build_plan(p, handle, true);
    plan->refusal = std::string("cuDNN does not build this convolution graph") +
                    (allow_runtime_compilation ? "" : " from a precompiled engine") + ": " + e.get_message();
    return plan;
  }
  if (auto e = graph->get_workspace_size(plan->workspace); e.is_bad()) {
    plan->refusal = "cuDNN workspace query failed: " + e.get_message();
    return plan;
  }
  plan->graph = std::move(graph);
  return plan;
}

Status check(const ConvCudnnProblem& p) {
  if (p.n <= 0 || p.cin <= 0 || p.t <= 0 || p.h <= 0 || p.w <= 0 || p.cout <= 0 || p.kt <= 0 || p.kh <= 0 ||
      p.kw <= 0 || p.stride_t <= 0 || p.stride_h <= 0 || p.stride_w <= 0 || p.pad_top < 0 || p.pad_bottom < 0 ||
      p.pad_left < 0 || p.pad_right < 0)
    return fail(Status::InvalidArgument, "conv3d_cudnn: non-positive size/stride or negative padding: " +
                                             problem_str(p));
  if (out_t(p) == 0 || out_h(p) == 0 || out_w(p) == 0)
    return fail(Status::InvalidArgument, "conv3d_cudnn: input smaller than the kernel: " + problem_str(p));
  if (p.type != ElemType::BF16 && p.type != ElemType::F32)
    return fail(Status::InvalidArgument, "conv3d_cudnn: takes bf16 or f32 tensors");
  return Status::Ok;
}

Status get_plan(const ConvCudnnProblem& p, std::shared_ptr<Plan>* out, cudnnHandle_t* handle_out) {
  if (Status s = check(p); s != Status::Ok) return s;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return fail(Status::Unsupported, std::string("conv3d_cudnn: no current CUDA device: ") + cudaGetErrorString(e));
  State& st = state();
  auto h = st.handles.find(device);
  if (h == st.handles.end()) {
    cudnnHandle_t handle = nullptr;
    if (cudnnStatus_t s = cudnnCreate(&handle); s != CUDNN_STATUS_SUCCESS)
      return fail(Status::Unsupported, "conv3d_cudnn: cudnnCreate on device " + std::to_string(device) +
                                           " failed: " + cudnnGetErrorString(s));
    h = st.handles.emplace(device, handle).first;
  }
  const PlanKey key = make_key(p, device);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) it = st.plans.emplace(key, build_plan(p, h->second, /*allow_runtime_compilation=*/false)).first;
  if (!it->second->refusal.empty())
    return fail(Status::Unsupported, "conv3d_cudnn (" + problem_str(p) + "): " + it->second->refusal);
  *out = it->second;
  *handle_out = h->second;
  return Status::Ok;
}

}  // namespace

const char* conv_cudnn_last_error() { return t_error.c_str(); }

Status conv3d_cudnn_workspace_size(const ConvCudnnProblem& p, size_t* bytes) {
  if (!bytes) return fail(Status::InvalidArgument, "conv3d_cudnn_workspace_size: null output");
  std::lock_guard<std::mutex> lock(state().mu);
  std::shared_ptr<Plan> plan;
  cudnnHandle_t handle = nullptr;
  if (Status s = get_plan(p, &plan, &handle); s != Status::Ok) return s;
  *bytes = size_t(plan->workspace);
  t_error.clear();
  return Status::Ok;
}

Status conv3d_cudnn(const ConvCudnnProblem& p, const void* x, const void* weight, const float* bias, void* y,
                    void* workspace, size_t workspace_bytes, void* stream) {
  if (!x || !weight || !y || (p.bias && !bias))
    return fail(Status::InvalidArgument, "conv3d_cudnn: null x, weight, y or bias pointer");
  std::lock_guard<std::mutex> lock(state().mu);
  std::shared_ptr<Plan> plan;
  cudnnHandle_t handle = nullptr;
  if (Status s = get_plan(p, &plan, &handle); s != Status::Ok) return s;
  if (workspace_bytes < size_t(plan->workspace) || (plan->workspace > 0 && !workspace))
    return fail(Status::InvalidArgument, "conv3d_cudnn: the plan needs " + std::to_string(plan->workspace) +
                                             " bytes of workspace, got " + std::to_string(workspace_bytes));
  if (cudnnStatus_t s = cudnnSetStream(handle, static_cast<cudaStream_t>(stream)); s != CUDNN_STATUS_SUCCESS)
    return fail(Status::LaunchFailed, std::string("conv3d_cudnn: cudnnSetStream failed: ") + cudnnGetErrorString(s));
  std::unordered_map<int64_t, void*> pack = {
      {kUidX, const_cast<void*>(x)}, {kUidW, const_cast<void*>(weight)}, {kUidY, y}};
  if (p.bias) pack.emplace(kUidB, const_cast<float*>(bias));
  if (auto e = plan->graph->execute(handle, pack, workspace); e.is_bad())
    return fail(Status::LaunchFailed, "conv3d_cudnn (" + problem_str(p) + "): execution failed: " + e.get_message());
  t_error.clear();
  return Status::Ok;
}

size_t conv_cudnn_cached_plans() {
  std::lock_guard<std::mutex> lock(state().mu);
  size_t n = 0;
  for (const auto& [key, plan] : state().plans) n += plan->graph != nullptr;
  return n;
}

}  // namespace td::kernels

#endif  // TURBODIFF_HAVE_CUDNN
