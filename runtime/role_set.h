// RoleSet: the worker classes one worker process hosts. Either a single
// class (a plain group), or several named roles, one instance of each class
// per process (colocation: actor + rollout + reference on one GPU, or actor +
// critic), as WorkerGroup::spawn_colocated builds them.
//
// In a colocated process each role's methods are reachable under the role's
// prefix, verl-style: role "actor" with method "compute_log_prob" is
// "actor_compute_log_prob". The built-in methods (method_table.h) exist once
// per role: "actor__query_mesh" asks the actor instance for its meshes.
//
// The driver and every worker build the same RoleSet from the same specs, so
// a call names its method by the prefixed name alone.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/method_table.h"
#include "runtime/value.h"

namespace baton {

// One role of a colocated group: its name, its registered worker class
// (BATON_WORKER) and the arguments its constructor gets.
//
// Example:
//   WorkerGroup::spawn_colocated({{"actor", "ActorWorker", {config}},
//                                 {"ref", "RefWorker", {config}}}, pool);
struct RoleSpec {
  std::string role;  // letters, digits and '_'; empty only for a plain group
  std::string class_name;
  List init_args;
};

class RoleSet {
 public:
  // A method as a call reaches it.
  struct Target {
    size_t role = 0;  // index into the roles (0 for a plain class)
    const MethodSpec* method = nullptr;
    std::string wire_name;  // "add", or "actor_compute_log_prob"
  };

  // One role with an empty name: a plain group of `roles[0].class_name`.
  // Otherwise every role needs a distinct, well-formed name. Throws CallError
  // for no roles, a malformed or repeated role name, an unregistered class
  // (naming the role), or two roles whose prefixed method names collide.
  explicit RoleSet(const std::vector<RoleSpec>& roles);

  bool colocated() const { return colocated_; }
  // "Adder" for a plain group, "ActorWorker+RefWorker" for a colocated one:
  // the class name workers report (WorkerInfo::class_name, log prefixes,
  // error messages).
  const std::string& name() const { return name_; }
  size_t size() const { return roles_.size(); }
  const std::string& role(size_t i) const { return roles_[i]; }
  const WorkerClassSpec& spec(size_t i) const { return *specs_[i]; }
  // Throws CallError naming the roles there are.
  size_t role_index(const std::string& role) const;

  // A method by the name a call on the whole process uses ("add";
  // "actor_compute_log_prob" when colocated). Throws CallError listing the
  // methods there are.
  Target find(const std::string& name) const;
  // A method of role `role` by its own name ("compute_log_prob"). Throws
  // CallError naming the role and listing its methods.
  Target find(size_t role, const std::string& method) const;

  // "Adder.add", "ActorWorker+RefWorker.actor_compute_log_prob": how errors
  // name a method.
  std::string qualified(const Target& t) const { return name_ + "." + t.wire_name; }

 private:
  bool colocated_ = false;
  std::string name_;
  std::vector<std::string> roles_;
  std::vector<const WorkerClassSpec*> specs_;
  std::map<std::string, Target> prefixed_;  // colocated only
};

}  // namespace baton
