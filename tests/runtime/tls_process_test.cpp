// A worker group whose driver has BATON_TLS_CERT/BATON_TLS_KEY and whose
// workers trust BATON_TLS_CA: the workers meet over TLS 1.3 (net/tls.h),
// and the group's store refuses a plain client. Built only when OpenSSL's
// headers are found (tests/runtime/CMakeLists.txt).
#include <ATen/ops/full.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "net/tls.h"
#include "runtime/internal/auth_store.h"
#include "runtime/worker_group.h"
#include "tests/runtime/test_certificates.h"

namespace baton {
namespace {

TEST(TlsWorkerGroup, WorkersRendezvousOverTlsWhenTheEnvironmentAsksForIt) {
  if (!tls::available()) GTEST_SKIP() << "this build has no TLS";
  char dir[] = "/tmp/baton_tls_group_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string d = dir;
  test::write_test_certificates(d);
  ::setenv("BATON_TLS_CERT", (d + "/server.pem").c_str(), 1);
  ::setenv("BATON_TLS_KEY", (d + "/server.key").c_str(), 1);
  ::setenv("BATON_TLS_CA", (d + "/ca.pem").c_str(), 1);
  {
    ResourcePool pool = ResourcePool::cpu(2);
    WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
    std::vector<List> args;
    for (int r = 0; r < 2; ++r) args.push_back({at::full({2}, 1.0)});
    for (const Value& v : g.call_per_rank("all_reduce", args).get())
      EXPECT_TRUE(v.as_tensor().equal(at::full({2}, 2.0)));
    const auto port = static_cast<uint16_t>(g.call("info").get().as_list()[0].at("master_port").as_int());
    auto over_tls = c10::make_intrusive<AuthStore>("127.0.0.1", port);
    EXPECT_EQ(over_tls->protocol(), "TLSv1.3");
    EXPECT_GT(over_tls->getNumKeys(), 0);  // the workers' rendezvous keys
    ::unsetenv("BATON_TLS_CA");
    EXPECT_THROW(c10::make_intrusive<AuthStore>("127.0.0.1", port, std::string(),
                                                std::chrono::seconds(10), std::chrono::seconds(10)),
                 auth::AuthError);
  }
  ::unsetenv("BATON_TLS_CERT");
  ::unsetenv("BATON_TLS_KEY");
  ::unsetenv("BATON_TLS_CA");
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace baton
