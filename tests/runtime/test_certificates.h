// Certificates for the TLS tests (net/tls.h), made with OpenSSL's API in a
// directory: ca.pem (a CA), other_ca.pem (another CA), server.pem/server.key
// (for IP 127.0.0.1, issued by ca.pem) and elsewhere.pem/elsewhere.key (for
// IP 10.9.8.7, issued by ca.pem).
#pragma once

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <string>

namespace baton::test {

struct KeyAndCert {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  ~KeyAndCert() {
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

inline void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  ASSERT_NE(ext, nullptr) << value;
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A P-256 key and its certificate: a CA's (self-signed) when `issuer` is null,
// otherwise a server's for `ip`, signed by `issuer`.
inline void make(KeyAndCert& out, const char* name, const KeyAndCert* issuer, const char* ip = nullptr) {
  static long serial = 1;
  out.key = EVP_EC_gen("P-256");
  ASSERT_NE(out.key, nullptr);
  out.cert = X509_new();
  X509_set_version(out.cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(out.cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(out.cert), -60);
  X509_gmtime_adj(X509_getm_notAfter(out.cert), 3600);
  X509_set_pubkey(out.cert, out.key);
  X509_NAME* subject = X509_get_subject_name(out.cert);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name), -1, -1, 0);
  X509* signer = issuer ? issuer->cert : out.cert;
  X509_set_issuer_name(out.cert, X509_get_subject_name(signer));
  if (issuer == nullptr) {
    add_extension(out.cert, out.cert, NID_basic_constraints, "critical,CA:TRUE");
    add_extension(out.cert, out.cert, NID_key_usage, "critical,keyCertSign");
  } else {
    add_extension(out.cert, signer, NID_basic_constraints, "CA:FALSE");
    add_extension(out.cert, signer, NID_subject_alt_name, (std::string("IP:") + ip).c_str());
  }
  ASSERT_GT(X509_sign(out.cert, issuer ? issuer->key : out.key, EVP_sha256()), 0);
}

inline void write_pem(const std::string& path, X509* cert) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  PEM_write_X509(f, cert);
  std::fclose(f);
}

inline void write_pem(const std::string& path, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
}

// Writes the files listed above into `dir`.
inline void write_test_certificates(const std::string& dir) {
  KeyAndCert ca, other_ca, server, elsewhere;
  make(ca, "baton test CA", nullptr);
  make(other_ca, "another CA", nullptr);
  make(server, "store", &ca, "127.0.0.1");
  make(elsewhere, "store elsewhere", &ca, "10.9.8.7");
  write_pem(dir + "/ca.pem", ca.cert);
  write_pem(dir + "/other_ca.pem", other_ca.cert);
  write_pem(dir + "/server.pem", server.cert);
  write_pem(dir + "/server.key", server.key);
  write_pem(dir + "/elsewhere.pem", elsewhere.cert);
  write_pem(dir + "/elsewhere.key", elsewhere.key);
}

}  // namespace baton::test
