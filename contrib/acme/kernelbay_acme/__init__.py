"""kernelbay-acme: an example hardware-vendor plugin.

- `kernelbay_acme.platform.AcmePlatform` (entry point `kernelbay.platforms: acme`): current when
  `ACME_VISIBLE_DEVICES` names at least one device; prefers ACME_INT8, then SDPA, then VANILLA.
- `kernelbay_acme.backend.AcmeInt8Backend` (entry point `kernelbay.attention_backends: ACME_INT8`):
  paged attention over an int8 KV cache with one scale per (block, kv head);
- `kernelbay_acme.models.AcmeLlamaForCausalLM` (entry point `kernelbay.models: LlamaForCausalLM`): takes the
  built-in Llama slot; off Acme hardware it declines (`NoTarget`) and kernelbay falls back to the built-in.

Nothing here is imported by `import kernelbay`; the registry imports a module when its slot is resolved.
"""
