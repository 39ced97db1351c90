#include "rendezvous/core/protocol.hpp"

#include <gtest/gtest.h>

#include "tests/support/hex.hpp"

namespace ddprun::rdzv::core {
namespace {

using test::hex;
using test::unhex;

// Decodes one complete request; the request's views point into the returned holder's bytes.
struct Decoded {
  std::string bytes;
  Request request;
  size_t consumed = 0;
};

Decoded decode_all(Dialect d, std::string bytes) {
  Decoded out;
  out.bytes = std::move(bytes);
  const DecodeResult res = decode_request(d, out.bytes, Limits{}, out.request);
  EXPECT_EQ(res.status, DecodeStatus::Complete) << res.error;
  out.consumed = res.consumed;
  return out;
}

TEST(ProtocolTest, OpcodeTablesMatchBothNumberings) {
  EXPECT_EQ(op_from_wire(Dialect::Legacy, 0), Op::Set);
  EXPECT_EQ(op_from_wire(Dialect::Legacy, 7), Op::WatchKey);
  EXPECT_EQ(op_from_wire(Dialect::Legacy, 8), Op::DeleteKey);
  EXPECT_EQ(op_from_wire(Dialect::Legacy, 9), std::nullopt);
  EXPECT_EQ(op_from_wire(Dialect::V2, 0), Op::Validate);
  EXPECT_EQ(op_from_wire(Dialect::V2, 1), Op::Set);
  EXPECT_EQ(op_from_wire(Dialect::V2, 8), Op::DeleteKey);
  EXPECT_EQ(op_from_wire(Dialect::V2, 12), Op::CancelWait);
  EXPECT_EQ(op_from_wire(Dialect::V2, 13), Op::Ping);
  EXPECT_EQ(op_from_wire(Dialect::V2, 16), Op::QueueLen);
  EXPECT_EQ(op_from_wire(Dialect::V2, 17), Op::List);
  EXPECT_EQ(op_from_wire(Dialect::V2, 18), std::nullopt);
  EXPECT_EQ(op_to_wire(Dialect::Legacy, Op::Append), std::nullopt);
  EXPECT_EQ(op_to_wire(Dialect::V2, Op::WatchKey), std::nullopt);
}

// Appendix A of the protocol notes: real 1.13.1 client traffic.
TEST(ProtocolTest, DecodesCaptured113AddInit) {
  const Decoded d = decode_all(Dialect::Legacy, unhex("03 0500000000000000 696e69742f 0100000000000000"));
  EXPECT_EQ(d.request.op, Op::Add);
  EXPECT_EQ(d.request.keys.at(0), "init/");
  EXPECT_EQ(d.request.delta, 1);
  EXPECT_EQ(d.consumed, 22u);
}

TEST(ProtocolTest, DecodesCaptured113SetWaitGetAddCas) {
  const Decoded set_holder = decode_all(Dialect::Legacy, unhex("00 0300000000000000 2f6b31 0200000000000000 7631"));
  const Request& set = set_holder.request;
  EXPECT_EQ(set.op, Op::Set);
  EXPECT_EQ(set.keys.at(0), "/k1");
  EXPECT_EQ(set.values.at(0), "v1");

  const Decoded wait_holder = decode_all(Dialect::Legacy, unhex("05 0100000000000000 0300000000000000 2f6b31"));
  const Request& wait = wait_holder.request;
  EXPECT_EQ(wait.op, Op::Wait);
  ASSERT_EQ(wait.keys.size(), 1u);
  EXPECT_EQ(wait.keys[0], "/k1");

  const Decoded add_holder = decode_all(Dialect::Legacy, unhex("03 0400000000000000 2f636e74 feffffffffffffff"));
  const Request& add = add_holder.request;
  EXPECT_EQ(add.delta, -2);

  const Decoded cas_holder =
      decode_all(Dialect::Legacy, unhex("01 0300000000000000 2f6373 0000000000000000 0300000000000000 6e6577"));
  const Request& cas = cas_holder.request;
  EXPECT_EQ(cas.op, Op::CompareSet);
  EXPECT_EQ(cas.values.at(0), "");
  EXPECT_EQ(cas.values.at(1), "new");

  EXPECT_EQ(decode_all(Dialect::Legacy, unhex("06")).request.op, Op::GetNumKeys);
  EXPECT_EQ(decode_all(Dialect::Legacy, unhex("08 0300000000000000 2f6b31")).request.op, Op::DeleteKey);
}

TEST(ProtocolTest, EveryPrefixOfARequestIsIncomplete) {
  const std::string bytes = unhex("01 0300000000000000 2f6373 0000000000000000 0300000000000000 6e6577");
  for (size_t n = 0; n < bytes.size(); ++n) {
    Request r;
    const DecodeResult res = decode_request(Dialect::Legacy, std::string_view(bytes).substr(0, n), Limits{}, r);
    EXPECT_EQ(res.status, DecodeStatus::Incomplete) << "prefix of " << n << " bytes";
  }
}

TEST(ProtocolTest, CoalescedRequestsDecodeOneAtATime) {
  // SET+DELETE_KEY in one segment, as a 1.13 client sent them (capture log2).
  const std::string bytes =
      unhex("00 0300000000000000 2f6b31 0200000000000000 7631") + unhex("08 0300000000000000 2f6b31");
  Request r;
  DecodeResult a = decode_request(Dialect::Legacy, bytes, Limits{}, r);
  ASSERT_EQ(a.status, DecodeStatus::Complete);
  EXPECT_EQ(r.op, Op::Set);
  DecodeResult b = decode_request(Dialect::Legacy, std::string_view(bytes).substr(a.consumed), Limits{}, r);
  ASSERT_EQ(b.status, DecodeStatus::Complete);
  EXPECT_EQ(r.op, Op::DeleteKey);
  EXPECT_EQ(a.consumed + b.consumed, bytes.size());
}

TEST(ProtocolTest, DetectsDialectFromFirstBytes) {
  EXPECT_EQ(detect_dialect("").status, HandshakeStatus::NeedMore);
  EXPECT_EQ(detect_dialect(unhex("03")).status, HandshakeStatus::Legacy);
  EXPECT_EQ(detect_dialect(unhex("00 ce f7")).status, HandshakeStatus::NeedMore);
  const Handshake v2 = detect_dialect(unhex("00 cef7853c 0d"));
  EXPECT_EQ(v2.status, HandshakeStatus::V2);
  EXPECT_EQ(v2.consumed, 5u);
  // A legacy SET whose key length starts where the magic would be.
  const Handshake legacy_set = detect_dialect(unhex("00 0300000000000000 2f6b31"));
  EXPECT_EQ(legacy_set.status, HandshakeStatus::Legacy);
  EXPECT_EQ(legacy_set.consumed, 0u);
}

TEST(ProtocolTest, V2OnlyOperationsDecode) {
  const Decoded ms_holder = decode_all(Dialect::V2, unhex("0b 0200000000000000 0100000000000000 61 0100000000000000 31"
                                                          "0100000000000000 62 0000000000000000"));
  const Request& ms = ms_holder.request;
  EXPECT_EQ(ms.op, Op::MultiSet);
  ASSERT_EQ(ms.keys.size(), 2u);
  EXPECT_EQ(ms.keys[1], "b");
  EXPECT_EQ(ms.values[0], "1");
  EXPECT_EQ(ms.values[1], "");
  const Decoded ping_holder = decode_all(Dialect::V2, unhex("0d 78563412"));
  const Request& ping = ping_holder.request;
  EXPECT_EQ(ping.op, Op::Ping);
  EXPECT_EQ(ping.number, 0x12345678u);
  EXPECT_EQ(decode_all(Dialect::V2, unhex("0c")).request.op, Op::CancelWait);
  EXPECT_EQ(decode_all(Dialect::V2, unhex("11")).request.op, Op::List);
  const Decoded pop_holder = decode_all(Dialect::V2, unhex("0f 0100000000000000 71"));
  const Request& pop = pop_holder.request;
  EXPECT_EQ(pop.op, Op::QueuePop);
  EXPECT_EQ(pop.keys[0], "q");
}

TEST(ProtocolTest, UnknownOpcodeIsAnErrorNamingTheByte) {
  Request r;
  DecodeResult res = decode_request(Dialect::Legacy, unhex("09"), Limits{}, r);
  EXPECT_EQ(res.status, DecodeStatus::Error);
  EXPECT_NE(res.error.find("unknown command byte 9"), std::string::npos) << res.error;
  res = decode_request(Dialect::V2, unhex("ff"), Limits{}, r);
  EXPECT_EQ(res.status, DecodeStatus::Error);
}

TEST(ProtocolTest, OversizedFieldsAreErrorsBeforeTheBytesArrive) {
  Limits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 32;
  limits.max_keys_per_request = 4;
  Request r;
  // Key length 17 > 16: rejected from the header alone.
  DecodeResult res = decode_request(Dialect::Legacy, unhex("02 1100000000000000"), limits, r);
  EXPECT_EQ(res.status, DecodeStatus::Error);
  EXPECT_NE(res.error.find("key of 17 bytes is over the limit of 16"), std::string::npos) << res.error;
  res = decode_request(Dialect::Legacy, unhex("00 0100000000000000 61 2100000000000000"), limits, r);
  EXPECT_EQ(res.status, DecodeStatus::Error);
  EXPECT_NE(res.error.find("value of 33 bytes"), std::string::npos) << res.error;
  res = decode_request(Dialect::Legacy, unhex("05 0500000000000000"), limits, r);
  EXPECT_EQ(res.status, DecodeStatus::Error);
  EXPECT_NE(res.error.find("count 5 is over the limit of 4"), std::string::npos) << res.error;
  // A huge length (2^63) must not overflow the size arithmetic.
  res = decode_request(Dialect::V2, unhex("04 0000000000000080"), Limits{}, r);
  EXPECT_EQ(res.status, DecodeStatus::Error);
}

TEST(ProtocolTest, WholeRequestSizeIsBounded) {
  Limits limits;
  limits.max_request_bytes = 100;
  Request r;
  // 4 keys of 30 bytes each are individually fine but 120+ bytes in total.
  std::string req = unhex("05 0400000000000000");
  DecodeResult res;
  for (int i = 0; i < 4; ++i) req += unhex("1e00000000000000") + std::string(30, 'k');
  res = decode_request(Dialect::Legacy, req, limits, r);
  EXPECT_EQ(res.status, DecodeStatus::Error);
  EXPECT_NE(res.error.find("over the limit of 100"), std::string::npos) << res.error;
}

TEST(ProtocolTest, EncodersWriteLittleEndianFields) {
  std::string out;
  put_u8(out, 3);
  put_bytes(out, "init/");
  put_i64(out, 1);
  EXPECT_EQ(hex(out), "030500000000000000696e69742f0100000000000000");
  out.clear();
  put_u32(out, kValidateMagic);
  EXPECT_EQ(hex(out), "cef7853c");
}

}  // namespace
}  // namespace ddprun::rdzv::core
