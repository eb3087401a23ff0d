"""kdn for vLLM: KdnConnector, a KV connector (v1 API) that shares KV through kdnd.

Enable it with
    --kv-transfer-config '{"kv_connector": "KdnConnector", "kv_connector_module_path": "kdn.vllm",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}'
See docs/vllm.md for what it does, its settings (kv_connector_extra_config) and its limits.
"""

from .connector import KdnConnector
from .stats import process_stats

__all__ = ["KdnConnector", "process_stats"]
