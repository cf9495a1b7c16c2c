#include "pool_helpers.hpp"
