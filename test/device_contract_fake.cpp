#include "fake_harness.hpp"

#define STREAMPOOL_CONTRACT_HARNESSES FakeHarness
#include "device_contract.hpp"
