#include "pipeline/residency.h"

#include <map>

#include "core/error.h"

namespace td::pipeline {

const char* offload_policy_name(OffloadPolicy p) {
  switch (p) {
    case OffloadPolicy::None: return "none";
    case OffloadPolicy::Model: return "model";
    case OffloadPolicy::Auto: return "auto";
  }
  return "?";
}

OffloadPolicy parse_offload_policy(const std::string& s) {
  if (s == "none") return OffloadPolicy::None;
  if (s == "model") return OffloadPolicy::Model;
  if (s == "auto") return OffloadPolicy::Auto;
  fail(ErrorKind::Usage, "--offload ", s, ": expected none, model or auto");
}

const char* component_name(Component c, bool two_experts) {
  switch (c) {
    case Component::TextEncoder: return "text_encoder";
    case Component::Dit: return two_experts ? "high_noise_dit" : "dit";
    case Component::LowNoiseDit: return "low_noise_dit";
    case Component::Vae: return "vae";
  }
  return "?";
}

const char* move_kind_name(MoveKind k) {
  switch (k) {
    case MoveKind::Load: return "load";
    case MoveKind::Stage: return "stage";
    case MoveKind::Upload: return "upload";
    case MoveKind::Offload: return "offload";
    case MoveKind::Release: return "release";
  }
  return "?";
}

OffloadPolicy resolve_offload(OffloadPolicy policy, size_t resident_bytes, size_t working_bytes, size_t free_bytes) {
  if (policy != OffloadPolicy::Auto) return policy;
  return resident_bytes + working_bytes <= free_bytes ? OffloadPolicy::None : OffloadPolicy::Model;
}

size_t ResidencyPlan::max_on_gpu() const {
  size_t m = 0;
  for (const auto& s : steps) m = std::max(m, s.on_gpu.size());
  return m;
}

ResidencyPlan plan_residency(const std::vector<Component>& stages, OffloadPolicy policy,
                             const std::set<Component>& gpu) {
  TD_CHECK(policy == OffloadPolicy::None || policy == OffloadPolicy::Model, Internal,
           "plan_residency: resolve --offload auto first");
  // Where a model is: absent, on the host only (staged, or a host-run model),
  // on the GPU only (loaded there directly), or on the GPU with a host copy.
  enum class Where { Absent, Host, Gpu, Both };
  std::map<Component, Where> where;
  std::map<Component, size_t> first, last;
  std::map<Component, size_t> uses;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (!first.count(stages[i])) first[stages[i]] = i;
    last[stages[i]] = i;
    ++uses[stages[i]];
  }
  // One contiguous run of stages: loaded straight to where it runs, released after.
  auto contiguous = [&](Component c) { return last[c] - first[c] + 1 == uses[c]; };
  auto on_gpu = [&](Component c) {
    auto it = where.find(c);
    return it != where.end() && (it->second == Where::Gpu || it->second == Where::Both);
  };

  ResidencyPlan plan;
  for (size_t i = 0; i < stages.size(); ++i) {
    const Component c = stages[i];
    ResidencyStep step;
    step.stage = c;
    // Free what no later stage uses, first, to make room.
    for (auto& [r, w] : where)
      if (w != Where::Absent && last[r] < i) {
        step.before.push_back({MoveKind::Release, r});
        w = Where::Absent;
      }
    const bool runs_on_gpu = gpu.count(c) > 0;
    if (runs_on_gpu && policy == OffloadPolicy::Model) {
      for (auto& [r, w] : where)
        if (r != c && (w == Where::Gpu || w == Where::Both)) {
          // Still used later (else released above), so it has a host copy.
          TD_CHECK(w == Where::Both, Internal, "residency: ", component_name(r), " on the GPU without a host copy");
          step.before.push_back({MoveKind::Offload, r});
          w = Where::Host;
        }
    }
    Where& w = where[c];
    if (w == Where::Absent) {
      if (!runs_on_gpu || policy == OffloadPolicy::None || contiguous(c)) {
        step.before.push_back({MoveKind::Load, c});
        w = runs_on_gpu ? Where::Gpu : Where::Host;
      } else {
        step.before.push_back({MoveKind::Stage, c});
        step.before.push_back({MoveKind::Upload, c});
        w = Where::Both;
      }
    } else if (runs_on_gpu && w == Where::Host) {
      step.before.push_back({MoveKind::Upload, c});
      w = Where::Both;
    }
    for (const auto& kv : where)
      if (on_gpu(kv.first)) step.on_gpu.insert(kv.first);
    plan.steps.push_back(std::move(step));
  }
  for (auto& [r, w] : where)
    if (w != Where::Absent) plan.final_moves.push_back({MoveKind::Release, r});
  return plan;
}

std::string describe_plan(const ResidencyPlan& plan, bool two_experts) {
  std::string s;
  auto moves = [&](const std::vector<ResidencyMove>& ms) {
    std::string m;
    for (const auto& mv : ms) m += cat(m.empty() ? "" : ", ", move_kind_name(mv.kind), " ", component_name(mv.component, two_experts));
    return m;
  };
  for (const auto& st : plan.steps) {
    std::string g;
    for (const auto c : st.on_gpu) g += cat(g.empty() ? "" : ", ", component_name(c, two_experts));
    s += cat(component_name(st.stage, two_experts), ": ", moves(st.before), " | gpu: ", g.empty() ? "-" : g, "\n");
  }
  s += cat("end: ", moves(plan.final_moves), "\n");
  return s;
}

}  // namespace td::pipeline
