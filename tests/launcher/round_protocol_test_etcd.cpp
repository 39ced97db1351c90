// The round protocol's tests (round_protocol_test.cpp) through the etcd backend, against a real
// etcd: in the end-to-end binary, since each test starts an etcd member.
#define ROUND_PROTOCOL_ON_ETCD 1
#include "tests/launcher/round_protocol_test.cpp"
