#include "runtime/role_set.h"

#include <cctype>

#include "base/errors.h"

namespace baton {

namespace {

bool well_formed(const std::string& role) {
  if (role.empty()) return false;
  for (char c : role) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

RoleSet::RoleSet(const std::vector<RoleSpec>& roles) {
  if (roles.empty()) throw CallError("a worker group needs at least one role");
  colocated_ = !(roles.size() == 1 && roles[0].role.empty());
  for (const RoleSpec& r : roles) {
    if (colocated_) {
      if (!well_formed(r.role)) {
        throw CallError("colocated role '" + r.role +
                        "': a role name is non-empty and has only letters, digits and '_'");
      }
      for (const std::string& seen : roles_) {
        if (seen == r.role) throw CallError("colocated role '" + r.role + "' is given twice");
      }
    }
    try {
      specs_.push_back(&WorkerRegistry::global().get(r.class_name));
    } catch (const CallError& e) {
      if (!colocated_) throw;
      throw CallError("colocated role '" + r.role + "': " + e.what());
    }
    roles_.push_back(r.role);
    name_ += (name_.empty() ? "" : "+") + r.class_name;
  }
  if (!colocated_) return;

  for (size_t i = 0; i < roles_.size(); ++i) {
    std::vector<std::string> methods = specs_[i]->method_names();
    for (const std::string& b : builtin_method_names()) {
      if (b[0] == '_') methods.push_back(b);  // internal built-ins too, e.g. "_query_mesh"
    }
    for (const std::string& m : methods) {
      Target t{i, &specs_[i]->method(m), roles_[i] + "_" + m};
      auto [it, fresh] = prefixed_.emplace(t.wire_name, t);
      if (!fresh && it->second.role != i) {
        throw CallError("colocated roles '" + roles_[it->second.role] + "' and '" + roles_[i] +
                        "' both give a method named '" + t.wire_name +
                        "'; rename one of the roles");
      }
    }
  }
}

size_t RoleSet::role_index(const std::string& role) const {
  for (size_t i = 0; i < roles_.size(); ++i) {
    if (roles_[i] == role && colocated_) return i;
  }
  if (!colocated_) {
    throw CallError("group of " + name_ + " has no roles (it was not spawned colocated); role '" +
                    role + "' does not exist");
  }
  throw CallError("colocated group " + name_ + " has no role '" + role +
                  "'; roles: " + join(roles_));
}

RoleSet::Target RoleSet::find(const std::string& name) const {
  if (!colocated_) return Target{0, &specs_[0]->method(name), name};
  auto it = prefixed_.find(name);
  if (it != prefixed_.end()) return it->second;
  std::vector<std::string> known;
  for (const auto& [n, t] : prefixed_) {
    if (t.method->name[0] != '_') known.push_back(n);
  }
  throw CallError("colocated group " + name_ + " has no method '" + name +
                  "'; methods (role_method, or role(name).call(method)): " + join(known));
}

RoleSet::Target RoleSet::find(size_t role, const std::string& method) const {
  try {
    return Target{role, &specs_[role]->method(method),
                  colocated_ ? roles_[role] + "_" + method : method};
  } catch (const CallError& e) {
    if (!colocated_) throw;
    throw CallError("role '" + roles_[role] + "' of colocated group " + name_ + ": " + e.what());
  }
}

}  // namespace baton
