// Everything a custom RL worker needs, in one include: the runtime's actor API
// (runtime/baton.h: Worker, MethodTable, BATON_WORKER, WorkerGroup,
// ResourcePool, Value, futures, the baton::Error family), process groups for
// collectives of its own, DataProto and its dispatch modes, a role's model
// (RoleModel: the engine's sharded transformer, optimizer, offload and
// checkpoints over the group's parallel layout), the prompt batch the roles
// take, the RL algorithm kernels with their registries (BATON_POLICY_LOSS,
// BATON_ADVANTAGE_ESTIMATOR) and the reward functions' registry
// (BATON_REWARD_FUNCTION).
//
// Example: README.md, "Writing a custom RL worker" (built by InstallTest
// against an installed baton, from this include alone).
#pragma once

#include "dispatch/dispatch.h"              // IWYU pragma: export
#include "runtime/baton.h"                  // IWYU pragma: export
#include "runtime/process_group.h"          // IWYU pragma: export
#include "workers/algos/algo_registry.h"    // IWYU pragma: export
#include "workers/algos/core_algos.h"       // IWYU pragma: export
#include "workers/rewards/reward_registry.h"  // IWYU pragma: export
#include "workers/roles/prompt_batch.h"     // IWYU pragma: export
#include "workers/roles/role_model.h"       // IWYU pragma: export
