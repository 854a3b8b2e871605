"""kernelbay-acme: an example hardware-vendor plugin.

- `kernelbay_acme.platform.AcmePlatform` (entry point `kernelbay.platforms: acme`): current when
  `ACME_VISIBLE_DEVICES` names at least one device; prefers ACME_INT8, then SDPA, then VANILLA.
- `kernelbay_acme.backend.AcmeInt8Backend` (entry point `kernelbay.attention_backends: ACME_INT8`):
  paged attention over an int8 KV cache with one scale per (block, kv head).

It requires the contract (`kernelbay`) only; Acme's Llama build, which needs the runtime, is the separate
distribution kernelbay-acme-llama (contrib/acme-llama).

Nothing here is imported by `import kernelbay`; the registry imports a module when its slot is resolved.
"""
