// Colocated roles: several worker classes in one process per slot.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <stdexcept>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "dispatch/worker_function.h"
#include "runtime/baton.h"

namespace baton {
namespace {

namespace mode = dispatch_mode;

at::Tensor ranks_tensor(int64_t rows, int rank) {
  return at::full({rows}, static_cast<int64_t>(rank), at::kLong);
}

Value who(Worker& w, const std::string& role, int64_t calls) {
  const WorkerInfo& i = w.info();
  return Dict{{"role", role},          {"pid", static_cast<int64_t>(getpid())},
              {"rank", i.rank},        {"world", i.world_size},
              {"class", i.class_name}, {"group", i.group_name},
              {"tp", i.coords.tp},     {"dp", i.coords.dp},
              {"calls", calls}};
}

// Scales "x"; registers mesh "actor" as the group's tp=2 x dp=2 layout.
class ActorRole : public Worker {
 public:
  explicit ActorRole(const List& args) : scale_(args.at(0).as_int()) {
    register_mesh("actor", info().coords.dp, info().coords.tp == 0);
  }
  DataProto compute(const DataProto& b) {
    return DataProto({{"y", b.tensor("x") * scale_}, {"seen_by", ranks_tensor(b.size(), rank())}});
  }
  Value whoami() { return who(*this, "actor", ++calls_); }
  int64_t scale() const { return scale_; }

  static void register_methods(MethodTable<ActorRole>& t) {
    t.def("compute", &ActorRole::compute, MethodOptions().set_dispatch_mode(mode::kDpComputeProto));
    t.def("tag", &ActorRole::compute, MethodOptions().set_dispatch_mode(mode::mesh_proto("actor")));
    t.def("whoami", &ActorRole::whoami);
  }

 private:
  int64_t scale_;
  int64_t calls_ = 0;
};
BATON_WORKER(ActorRole);

// Adds an offset; registers its own mesh "actor": one replica, the last rank collects.
class RefRole : public Worker {
 public:
  explicit RefRole(const List& args) : offset_(args.at(0).as_int()) {
    if (offset_ < 0) throw std::runtime_error("negative offset");
    register_mesh("actor", 0, rank() == world_size() - 1);
  }
  DataProto compute(const DataProto& b) {
    return DataProto({{"y", b.tensor("x") + offset_}, {"seen_by", ranks_tensor(b.size(), rank())}});
  }
  Value whoami() { return who(*this, "ref", ++calls_); }

  static void register_methods(MethodTable<RefRole>& t) {
    t.def("compute", &RefRole::compute, MethodOptions().set_dispatch_mode(mode::mesh_proto("actor")));
    t.def("whoami", &RefRole::whoami);
  }

 private:
  int64_t offset_;
  int64_t calls_ = 0;
};
BATON_WORKER(RefRole);

// For name collisions: role "a" with "b_c" and role "a_b" with "c" both give "a_b_c".
class ClashOne : public Worker {
 public:
  int64_t f() { return 1; }
  static void register_methods(MethodTable<ClashOne>& t) { t.def("b_c", &ClashOne::f); }
};
BATON_WORKER(ClashOne);
class ClashTwo : public Worker {
 public:
  int64_t f() { return 2; }
  static void register_methods(MethodTable<ClashTwo>& t) { t.def("c", &ClashTwo::f); }
};
BATON_WORKER(ClashTwo);

// Runs on the instance of the role it was called through.
BATON_FUNCTION(scale_of_actor, [](Worker& w, const DataProto& b) {
  auto* actor = dynamic_cast<ActorRole*>(&w);
  if (actor == nullptr) throw std::runtime_error("not an ActorRole");
  return DataProto({{"scale", at::full({b.size()}, actor->scale(), at::kLong)}});
});

DataProto batch_of(int64_t rows) { return DataProto({{"x", at::arange(rows, at::kFloat)}}); }

std::vector<int64_t> as_vector(const at::Tensor& t) {
  at::Tensor c = t.contiguous().to(at::kLong);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

class ColocatedTest : public ::testing::Test {
 protected:
  ResourcePool pool = ResourcePool::cpu(4);
  WorkerGroup group = WorkerGroup::spawn_colocated(
      {{"actor", "ActorRole", {10}}, {"ref", "RefRole", {100}}}, pool,
      WorkerGroupOptions().set_layout(ParallelLayout{.tp = 2, .dp = 2}));
};

TEST_F(ColocatedTest, RolesShareOneProcessPerSlotAndGetTheSameWorkerInfo) {
  EXPECT_EQ(group.roles(), (std::vector<std::string>{"actor", "ref"}));
  EXPECT_EQ(group.class_name(), "ActorRole+RefRole");
  EXPECT_EQ(group.role("ref").class_name(), "RefRole");
  std::vector<pid_t> pids = group.pids();
  ASSERT_EQ(pids.size(), 4u);
  Value actors = group.call("actor_whoami").get();
  group.call("actor_whoami").get();
  Value refs = group.role("ref").call("whoami").get();
  for (int r = 0; r < 4; ++r) {
    const Value& a = actors.as_list()[r];
    const Value& f = refs.as_list()[r];
    EXPECT_EQ(a.at("pid").as_int(), pids[r]) << r;
    EXPECT_EQ(f.at("pid").as_int(), pids[r]) << r;
    for (const char* key : {"rank", "world", "class", "group", "tp", "dp"}) {
      EXPECT_EQ(a.at(key), f.at(key)) << key << " on rank " << r;
    }
    EXPECT_EQ(a.at("class").as_string(), "ActorRole+RefRole");
    EXPECT_EQ(a.at("calls").as_int(), 1);  // each role instance keeps its own state
    EXPECT_EQ(f.at("calls").as_int(), 1);
  }
}

TEST_F(ColocatedTest, PrefixedNamesAndRoleHandlesHonourEachRolesDispatchMode) {
  DataProto in = batch_of(8);
  // actor.compute: DP_COMPUTE_PROTO over the 4 ranks.
  for (const DataProto& out : {group.call("actor_compute", {in}).get().as<DataProto>(),
                               group.role("actor").call("compute", {in}).get().as<DataProto>()}) {
    EXPECT_TRUE(out.tensor("y").equal(in.tensor("x") * 10));
    EXPECT_EQ(as_vector(out.tensor("seen_by")), (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3}));
  }
  // actor.tag: the actor's mesh "actor" (dp = rank / 2, tp 0 collects).
  DataProto tagged = group.role("actor").call("tag", {in}).get().as<DataProto>();
  EXPECT_EQ(as_vector(tagged.tensor("seen_by")), (std::vector<int64_t>{0, 0, 0, 0, 2, 2, 2, 2}));
  // ref.compute: the ref's own mesh "actor" (one replica, rank 3 collects).
  for (const DataProto& out : {group.call("ref_compute", {in}).get().as<DataProto>(),
                               group.role("ref").call("compute", {in}).get().as<DataProto>()}) {
    EXPECT_TRUE(out.tensor("y").equal(in.tensor("x") + 100));
    EXPECT_EQ(as_vector(out.tensor("seen_by")), std::vector<int64_t>(8, 3));
  }
  EXPECT_EQ(group.role("actor").mesh("actor").dp_size, 2);
  EXPECT_EQ(group.role("ref").mesh("actor").dp_size, 1);
  // A function run through a role gets that role's instance.
  DataProto scales =
      group.role("actor").call(kExecuteWithFunc, {"scale_of_actor", in}).get().as<DataProto>();
  EXPECT_EQ(as_vector(scales.tensor("scale")), std::vector<int64_t>(8, 10));
  std::string err = error_of([&] {
    group.call("ref_execute_with_func", {"scale_of_actor", in}).get();
  });
  EXPECT_NE(err.find("ActorRole+RefRole.ref_execute_with_func failed on rank "), std::string::npos)
      << err;
  EXPECT_NE(err.find(": function 'scale_of_actor': not an ActorRole"), std::string::npos) << err;
}

TEST_F(ColocatedTest, UnknownRolesAndMethodsAreClearErrors) {
  std::string err = error_of([&] { group.role("critic"); });
  EXPECT_NE(err.find("colocated group ActorRole+RefRole has no role 'critic'; roles: actor, ref"),
            std::string::npos)
      << err;
  err = error_of([&] { group.role("actor").call("update"); });
  EXPECT_NE(err.find("role 'actor' of colocated group ActorRole+RefRole: worker class ActorRole "
                     "has no method 'update'; registered methods: compute, execute_with_func, "
                     "tag, whoami"),
            std::string::npos)
      << err;
  err = error_of([&] { group.call("critic_compute"); });
  EXPECT_NE(err.find("colocated group ActorRole+RefRole has no method 'critic_compute'; methods "
                     "(role_method, or role(name).call(method)): actor_compute"),
            std::string::npos)
      << err;
  err = error_of([&] { group.call("compute"); });  // a role's method needs its role
  EXPECT_NE(err.find("has no method 'compute'"), std::string::npos) << err;
  err = error_of([&] { group.role("actor").role("ref"); });
  EXPECT_NE(err.find("role view 'actor' of group"), std::string::npos) << err;
  err = error_of([&] { group.mesh("actor"); });
  EXPECT_NE(err.find("meshes are registered per role; use role(name).mesh(\"actor\")"),
            std::string::npos)
      << err;
  err = error_of([&] { group.call("actor_compute", {5}); });
  EXPECT_NE(err.find("ActorRole+RefRole.actor_compute (DP_COMPUTE_PROTO): argument 0 must be a "
                     "DataProto"),
            std::string::npos)
      << err;
  // Nothing above reached the workers.
  EXPECT_EQ(group.call("actor_whoami").get().as_list()[0].at("calls").as_int(), 1);
}

TEST(Colocated, BadRoleListsFailBeforeAnythingStarts) {
  ResourcePool pool = ResourcePool::cpu(2);
  auto spawn_error = [&](std::vector<RoleSpec> roles) {
    return error_of([&] { WorkerGroup::spawn_colocated(std::move(roles), pool); });
  };
  std::string err = spawn_error({{"actor", "ActorRole", {1}}, {"actor", "RefRole", {1}}});
  EXPECT_NE(err.find("colocated role 'actor' is given twice"), std::string::npos) << err;
  err = spawn_error({{"actor", "ActorRole", {1}}, {"ref", "NoSuchRole", {}}});
  EXPECT_NE(err.find("colocated role 'ref': worker class 'NoSuchRole' is not registered"),
            std::string::npos)
      << err;
  err = spawn_error({{"actor", "ActorRole", {1}}, {"", "RefRole", {1}}});
  EXPECT_NE(err.find("the role of class RefRole has no name"), std::string::npos) << err;
  err = spawn_error({{"act or", "ActorRole", {1}}});
  EXPECT_NE(err.find("colocated role 'act or': a role name is non-empty and has only letters"),
            std::string::npos)
      << err;
  err = spawn_error({});
  EXPECT_NE(err.find("no roles given"), std::string::npos) << err;
  err = spawn_error({{"a", "ClashOne", {}}, {"a_b", "ClashTwo", {}}});
  EXPECT_NE(err.find("colocated roles 'a' and 'a_b' both give a method named 'a_b_c'"),
            std::string::npos)
      << err;
  // The pool was never claimed: a plain group still fits, and has no roles.
  WorkerGroup plain = WorkerGroup::spawn("ClashOne", pool);
  EXPECT_TRUE(plain.roles().empty());
  err = error_of([&] { plain.role("a"); });
  EXPECT_NE(err.find("has no roles (it was not spawned colocated)"), std::string::npos) << err;
}

TEST(Colocated, AConstructorThatThrowsNamesItsRoleAndRank) {
  ResourcePool pool = ResourcePool::cpu(2);
  std::string err = error_of([&] {
    WorkerGroup::spawn_colocated({{"actor", "ActorRole", {1}}, {"ref", "RefRole", {-1}}}, pool);
  });
  EXPECT_NE(err.find("rank 0: constructing ActorRole+RefRole on rank 0 failed: role 'ref' "
                     "(RefRole): negative offset"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace baton
