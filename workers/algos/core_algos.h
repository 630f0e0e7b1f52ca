// baton::algos — the RL algorithm kernels, with verl's semantics: masked
// reductions, advantage estimators, KL estimators and controllers, agg_loss,
// the policy, value and entropy losses, and the registry that selects
// estimators and policy losses by name. Pure ATen: no processes, no I/O;
// every function works on tensors of any device.
//
// One header for users; each part also has its own:
//   masked_reductions.h  masked_sum / mean / var / whiten
//   agg_loss.h           LossAggMode, GlobalBatchInfo, agg_loss
//   advantage.h          compute_gae, compute_grpo, ... (AdvantageResult, Uids)
//   kl.h                 kl_penalty, compute_rewards, KL controllers
//   policy_loss.h        PolicyLossOptions, policy_loss(name, ...) and the built-ins
//   value_loss.h         compute_value_loss
//   entropy.h            entropy_from_logits, compute_entropy_loss
//   rollout_correction.h rollout IS weights, rejection sampling, off-policy metrics
//   algo_registry.h      register / find estimators and policy losses by name
#pragma once

#include "workers/algos/advantage.h"
#include "workers/algos/agg_loss.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/entropy.h"
#include "workers/algos/kl.h"
#include "workers/algos/masked_reductions.h"
#include "workers/algos/policy_loss.h"
#include "workers/algos/rollout_correction.h"
#include "workers/algos/value_loss.h"
