// Which model is where during `generate`: the residency plan.
//
// A run is a fixed sequence of stages, each run by one model (component):
//   text encoder (prompt and negative prompt, once for all samples),
//   VAE (I2V: encoding the image, once),
//   then per sample: the DiT experts in the order the steps use them (T2V: the
//   one DiT; I2V: the high-noise expert until the boundary, then the
//   low-noise one), and the VAE (decode).
// The plan is computed before anything loads and the run follows it stage by
// stage (generate.cpp checks that it does). Moves before a stage:
//   load     read the checkpoint straight onto the device it runs on
//   stage    read it into host memory (kept there while it is offloaded)
//   upload   copy the host copy to the GPU
//   offload  drop the GPU copy (the host copy stays)
//   release  free the model (no later stage uses it)
// Policies (--offload):
//   none   a model goes onto the GPU at its first use and stays there until
//          its last use: no transfers, the highest peak (the experts of
//          Wan2.2-A14B are both resident from the switch on).
//   model  only the model that runs is on the GPU: another GPU model is
//          offloaded to host memory when a stage needs the room; a model
//          whose uses form one contiguous run of stages is loaded straight to
//          the GPU and released after it (no host copy), otherwise it is
//          staged in host memory and uploaded for each run of uses. Peak =
//          the largest model plus its working set.
//   auto   none when the models used after the text encoder, plus the
//          working-set estimate, fit in the GPU's free memory, else model.
// A model outside `gpu` (the VAE with --vae-device cpu) only takes part
// through load and release. With --device cpu, generate plans as if the host
// were the GPU (the same plan as on CUDA; its moves share host memory), so the
// plan and its trace are tested on the CPU. The VAE is read before the text
// stage (it sizes the latent): its load / stage moves have nothing left to do.
#pragma once
#include <cstddef>
#include <set>
#include <string>
#include <vector>

namespace td::pipeline {

enum class OffloadPolicy { None, Model, Auto };
const char* offload_policy_name(OffloadPolicy p);
OffloadPolicy parse_offload_policy(const std::string& s);  // Usage error naming the value

enum class Component { TextEncoder, Dit, LowNoiseDit, Vae };
// "text_encoder", "dit" (T2V) / "high_noise_dit" (two experts), "low_noise_dit", "vae".
const char* component_name(Component c, bool two_experts = false);

enum class MoveKind { Load, Stage, Upload, Offload, Release };
const char* move_kind_name(MoveKind k);

struct ResidencyMove {
  MoveKind kind;
  Component component;
  bool operator==(const ResidencyMove&) const = default;
};

struct ResidencyStep {
  Component stage;                     // the model this stage runs
  std::vector<ResidencyMove> before;   // done, in order, before the stage runs
  std::set<Component> on_gpu;          // on the GPU while it runs
};

// Auto -> None when `resident_bytes` (every model the DiT stages and later
// stages keep on the GPU together) plus `working_bytes` fits in `free_bytes`,
// else Model. None and Model are returned as they are.
OffloadPolicy resolve_offload(OffloadPolicy policy, size_t resident_bytes, size_t working_bytes, size_t free_bytes);

// The plan for `stages` under a resolved policy (None or Model). `gpu` holds
// the components that run on the GPU; the others run on the host. After the
// last stage every model is released (the trailing moves are in `final_moves`).
struct ResidencyPlan {
  std::vector<ResidencyStep> steps;
  std::vector<ResidencyMove> final_moves;
  size_t max_on_gpu() const;  // the most models on the GPU at once
};
ResidencyPlan plan_residency(const std::vector<Component>& stages, OffloadPolicy policy,
                             const std::set<Component>& gpu);

// One line per step, e.g. "text_encoder: load text_encoder | gpu: text_encoder".
std::string describe_plan(const ResidencyPlan& plan, bool two_experts);

}  // namespace td::pipeline
