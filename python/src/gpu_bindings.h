// The engine-memory half of kdn._kdn: EngineLayout (an engine's paged KV memory as
// kdn_engine_layout describes it), host copies through it, and GpuKV (a registration of device
// KV memory with kdnd's GPU tier: retrieve, store, prefetch, ticket check, done event).
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

namespace kdn::python {

class Model;

// The Model behind a kdn._kdn.Model object (defined beside its binding in bindings.cc).
std::shared_ptr<Model> model_of(nanobind::handle model);

void bind_engine_memory(nanobind::module_& m);

}  // namespace kdn::python
