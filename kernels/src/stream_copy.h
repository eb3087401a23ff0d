// Moved to the public header so libkdn can share it.
#pragma once
#include <kdn/kernels/stream_copy.h>
