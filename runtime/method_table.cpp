#include "runtime/method_table.h"

namespace baton {

std::string MethodSpec::signature() const {
  std::string s = name + "(";
  for (size_t i = 0; i < params.size(); ++i) s += (i ? ", " : "") + params[i].name();
  return s + ") -> " + result.name();
}

void MethodSpec::check_args(const std::string& class_name, const List& args) const {
  if (args.size() != params.size()) {
    throw CallError(class_name + "." + name + " takes " + std::to_string(params.size()) +
                    " argument(s), " + std::to_string(args.size()) + " given; signature: " +
                    signature());
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (auto m = params[i].mismatch(args[i])) {
      throw CallError(class_name + "." + name + ": argument " + std::to_string(i) + ": " + *m +
                      "; signature: " + signature());
    }
  }
}

const MethodSpec& WorkerClassSpec::method(const std::string& method) const {
  auto it = methods.find(method);
  if (it != methods.end()) return it->second;
  std::string known;
  for (const auto& [n, m] : methods) known += (known.empty() ? "" : ", ") + n;
  throw CallError("worker class " + name + " has no method '" + method +
                  "'; registered methods: " + (known.empty() ? "none" : known));
}

WorkerRegistry& WorkerRegistry::global() {
  static WorkerRegistry registry;
  return registry;
}

void WorkerRegistry::add(WorkerClassSpec spec) {
  std::string name = spec.name;
  classes_[name] = std::move(spec);
}

const WorkerClassSpec& WorkerRegistry::get(const std::string& class_name) const {
  auto it = classes_.find(class_name);
  if (it != classes_.end()) return it->second;
  std::string known;
  for (const auto& [n, c] : classes_) known += (known.empty() ? "" : ", ") + n;
  throw CallError("no worker class named '" + class_name + "' is registered (BATON_WORKER); known: " +
                  (known.empty() ? "none" : known));
}

}  // namespace baton
