// Wire-level behaviour of one connection, without sockets: bytes in, bytes out.
#include "rendezvous/core/store_connection.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/errors.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "tests/support/hex.hpp"

namespace ddprun::rdzv::core {
namespace {

using test::hex;
using test::unhex;

struct Conn {
  KvStore& store;
  Limits limits;
  int async_outputs = 0;
  StoreConnection c{store, limits, [this] { ++async_outputs; }};
  explicit Conn(KvStore& s) : store(s) {}
  // Feeds bytes and returns the reply bytes produced.
  std::string feed(const std::string& bytes) {
    EXPECT_EQ(c.consume(bytes), bytes.size());
    return take();
  }
  std::string take() { return c.output().take_all(); }
};

// Appendix A: requests and the exact replies a 1.13.1 server gave.
TEST(StoreConnectionTest, Replays113CaptureByteForByte) {
  KvStore store;
  Conn conn(store);
  EXPECT_EQ(hex(conn.feed(unhex("03 0500000000000000 696e69742f 0100000000000000"))), "0100000000000000");
  EXPECT_EQ(conn.feed(unhex("00 0300000000000000 2f6b31 0200000000000000 7631")), "");
  EXPECT_EQ(hex(conn.feed(unhex("05 0100000000000000 0300000000000000 2f6b31"))), "00");
  EXPECT_EQ(hex(conn.feed(unhex("02 0300000000000000 2f6b31"))),
            "0200000000000000"
            "7631");
  EXPECT_EQ(hex(conn.feed(unhex("03 0400000000000000 2f636e74 0500000000000000"))), "0500000000000000");
  EXPECT_EQ(hex(conn.feed(unhex("03 0400000000000000 2f636e74 feffffffffffffff"))), "0300000000000000");
  EXPECT_EQ(hex(conn.feed(unhex("01 0300000000000000 2f6373 0000000000000000 0300000000000000 6e6577"))),
            "0300000000000000"
            "6e6577");
  EXPECT_EQ(hex(conn.feed(unhex("01 0400000000000000 2f637332 0300000000000000 657870 0300000000000000 6e6577"))),
            "0300000000000000"
            "657870");
  EXPECT_EQ(hex(conn.feed(unhex("06"))), "0400000000000000");  // init/, /k1, /cnt, /cs
  EXPECT_EQ(hex(conn.feed(unhex("08 0300000000000000 2f6b31"))), "0100000000000000");
  EXPECT_EQ(hex(conn.feed(unhex("08 0300000000000000 2f6b31"))), "0000000000000000");
}

TEST(StoreConnectionTest, RequestsSplitIntoSingleBytesAreServed) {
  KvStore store;
  Conn conn(store);
  const std::string req = unhex("03 0500000000000000 696e69742f 0100000000000000");
  std::string buffer;
  for (char c : req) {
    buffer.push_back(c);
    buffer.erase(0, conn.c.consume(buffer));
  }
  EXPECT_TRUE(buffer.empty());
  EXPECT_EQ(hex(conn.take()), "0100000000000000");
}

TEST(StoreConnectionTest, WaitRepliesWhenAnotherConnectionSetsTheKey) {
  KvStore store;
  Conn waiter(store), setter(store);
  EXPECT_EQ(waiter.feed(unhex("05 0100000000000000 0100000000000000 6b")), "");
  EXPECT_TRUE(waiter.c.waiting());
  setter.feed(unhex("00 0100000000000000 6b 0100000000000000 76"));
  EXPECT_EQ(waiter.async_outputs, 1);
  EXPECT_EQ(hex(waiter.take()), "00");
}

TEST(StoreConnectionTest, V2HandshakeThenCancelWait) {
  KvStore store;
  Conn conn(store);
  // VALIDATE (no reply), PING (echo), WAIT on a missing key, CANCEL_WAIT.
  EXPECT_EQ(hex(conn.feed(unhex("00 cef7853c 0d 2a000000"))), "2a000000");
  EXPECT_EQ(conn.c.dialect(), Dialect::V2);
  EXPECT_EQ(conn.feed(unhex("06 0100000000000000 0100000000000000 6b")), "");
  EXPECT_EQ(hex(conn.feed(unhex("0c"))), "01");
  EXPECT_EQ(store.waiting_clients(), 0u);
  // CANCEL_WAIT with nothing pending still answers.
  EXPECT_EQ(hex(conn.feed(unhex("0c"))), "01");
}

TEST(StoreConnectionTest, V2QueuesListAndMultiOps) {
  KvStore store;
  Conn conn(store);
  conn.feed(unhex("00 cef7853c"));
  conn.feed(unhex("0e 0100000000000000 71 0200000000000000 7878"));  // QUEUE_PUSH q "xx"
  EXPECT_EQ(hex(conn.feed(unhex("10 0100000000000000 71"))), "0100000000000000");
  EXPECT_EQ(hex(conn.feed(unhex("0f 0100000000000000 71"))),
            "0100000000000000"
            "0200000000000000"
            "7878");
  EXPECT_EQ(hex(conn.feed(unhex("0f 0100000000000000 71"))), "0000000000000000");
  conn.feed(
      unhex("0b 0200000000000000 0100000000000000 62 0100000000000000 32"
            "0100000000000000 61 0100000000000000 31"));  // MULTI_SET b=2 a=1
  EXPECT_EQ(hex(conn.feed(unhex("0a 0200000000000000 0100000000000000 61 0100000000000000 62"))),
            "0100000000000000"
            "31"
            "0100000000000000"
            "32");
  EXPECT_EQ(hex(conn.feed(unhex("11"))),
            "0200000000000000"
            "0100000000000000"
            "61"
            "0100000000000000"
            "62");
  conn.feed(unhex("09 0100000000000000 61 0200000000000000 3233"));  // APPEND a "23"
  EXPECT_EQ(hex(conn.feed(unhex("03 0100000000000000 61"))),
            "0300000000000000"
            "313233");
}

TEST(StoreConnectionTest, WrongMagicAfterHandshakeAndBadAddCloseTheConnection) {
  KvStore store;
  Conn conn(store);
  conn.feed(unhex("00 cef7853c"));
  EXPECT_THROW(conn.c.consume(unhex("00 01020304")), ProtocolError);
  Conn legacy(store);
  legacy.feed(unhex("00 0100000000000000 6b 0100000000000000 78"));  // SET k=x
  EXPECT_THROW(legacy.c.consume(unhex("03 0100000000000000 6b 0100000000000000")), ProtocolError);
}

TEST(StoreConnectionTest, NewRequestDropsAStaleWaitSoNoStrayByteFollows) {
  KvStore store;
  Conn conn(store), other(store);
  conn.feed(unhex("05 0100000000000000 0100000000000000 6b"));  // WAIT k (client then times out)
  EXPECT_EQ(hex(conn.feed(unhex("06"))), "0000000000000000");   // next request: GETNUMKEYS
  other.feed(unhex("00 0100000000000000 6b 0100000000000000 76"));
  EXPECT_EQ(conn.take(), "");  // no late STOP_WAITING
}

TEST(StoreConnectionTest, LegacyWatchKeyRegistersAndStreamsEvents) {
  KvStore store;
  Conn watcher(store), writer(store);
  EXPECT_EQ(hex(watcher.feed(unhex("07 0200000000000000 2f6b"))), "03");
  writer.feed(unhex("00 0200000000000000 2f6b 0100000000000000 31"));
  EXPECT_EQ(hex(watcher.take()),
            "01"
            "0200000000000000"
            "2f6b"
            "0000000000000000"
            "0100000000000000"
            "31");
}

TEST(StoreConnectionTest, DisconnectReleasesWaits) {
  KvStore store;
  {
    Conn conn(store);
    conn.feed(unhex("05 0100000000000000 0100000000000000 6b"));
    EXPECT_EQ(store.waiting_clients(), 1u);
  }
  EXPECT_EQ(store.waiting_clients(), 0u);
}

// ddprun-rendezvous answers what it is (durable, boot id) under kStoreInfoKey without
// keeping it as a key: PyTorch clients that count the keys see none of it.
TEST(StoreConnectionTest, AStoreThatDescribesItselfAnswersItsInfoKeyWithoutStoringIt) {
  KvStore store;
  Conn conn(store);
  conn.c.describe_store(std::make_shared<const std::string>(R"({"durable":false,"boot":"b1"})"));
  const std::string info(kStoreInfoKey);
  auto request = [](uint8_t op, const std::vector<std::string>& keys, bool counted) {
    std::string r;
    put_u8(r, op);
    if (counted) put_u64(r, keys.size());
    for (const auto& k : keys) put_bytes(r, k);
    return r;
  };
  // 1.13 opcodes: GET 2, CHECK 4, WAIT 5, GETNUMKEYS 6.
  std::string ready;
  put_u8(ready, kCheckReady);
  std::string stop;
  put_u8(stop, kStopWaiting);
  EXPECT_EQ(conn.feed(request(4, {info}, true)), ready);
  EXPECT_EQ(conn.feed(request(5, {info}, true)), stop);
  std::string value;
  put_bytes(value, R"({"durable":false,"boot":"b1"})");
  EXPECT_EQ(conn.feed(request(2, {info}, false)), value);
  EXPECT_EQ(hex(conn.feed(unhex("06"))), "0000000000000000") << "the description is no key";
  // With other keys, those decide.
  std::string not_ready;
  put_u8(not_ready, kCheckNotReady);
  EXPECT_EQ(conn.feed(request(4, {info, "/absent"}, true)), not_ready);
  // Without a description it is a key like any other, absent until set.
  Conn plain(store);
  EXPECT_EQ(plain.feed(request(4, {info}, true)), not_ready);
}

}  // namespace
}  // namespace ddprun::rdzv::core
