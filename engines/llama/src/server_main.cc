// kdn-llama-server: llama.cpp's own llama-server (OpenAI-compatible HTTP API, slots, continuous
// batching, chat templates) with kdnd as a node-wide prompt cache shared by every server
// process on the node and kept across restarts (server_prompt_cache.h). Every llama-server
// flag and endpoint works as upstream; ours join its --help and read LLAMA_ARG_KDN_* from the
// environment like its own:
//
//   kdn-llama-server -m model.gguf --port 8080 [--kdn-socket PATH] [--kdn-namespace NAME]
//                    [--kdn-token TOKEN] [--no-kdn]
#include "server_prompt_cache.h"

#include "arg.h"

int llama_server(int argc, char** argv);  // tools/server/server.cpp

namespace {

kdn::llama::PromptCacheOptions g_options;  // filled by llama.cpp's parser, read at attach

void add_kdn_options() {
  auto& extra = common_params_extra_options();
  extra.push_back(common_arg({"--kdn-socket"}, "PATH",
                             "kdnd's socket for the node-wide prompt cache (default: $KDN_SOCKET, else "
                             "$XDG_RUNTIME_DIR/kdn/kdnd.sock, else /tmp/kdn-$UID/kdnd.sock)",
                             [](common_params&, const std::string& v) { g_options.socket = v; })
                      .set_env("LLAMA_ARG_KDN_SOCKET")
                      .set_examples({LLAMA_EXAMPLE_SERVER}));
  extra.push_back(common_arg({"--kdn-namespace"}, "NAME",
                             "kdnd namespace to share prompts in, created if kdnd allows it (default: kdnd's "
                             "default namespace)",
                             [](common_params&, const std::string& v) { g_options.name_space = v; })
                      .set_env("LLAMA_ARG_KDN_NAMESPACE")
                      .set_examples({LLAMA_EXAMPLE_SERVER}));
  extra.push_back(common_arg({"--kdn-token"}, "TOKEN", "shared secret, if kdnd requires one (default: none)",
                             [](common_params&, const std::string& v) { g_options.token = v; })
                      .set_env("LLAMA_ARG_KDN_TOKEN")
                      .set_examples({LLAMA_EXAMPLE_SERVER}));
  extra.push_back(common_arg({"--kdn"}, {"--no-kdn"},
                             "use kdnd as a node-wide prompt cache: slots load the cached prefix of a prompt "
                             "from it and store whole chunks of 256 tokens after prompt processing (default: "
                             "enabled)",
                             [](common_params&, bool v) { g_options.enabled = v; })
                      .set_env("LLAMA_ARG_KDN")
                      .set_examples({LLAMA_EXAMPLE_SERVER}));
}

}  // namespace

int main(int argc, char** argv) {
  add_kdn_options();
  static kdn::llama::KdnPromptCache cache(&g_options);
  server_prompt_hook_instance() = &cache;
  return llama_server(argc, argv);
}
