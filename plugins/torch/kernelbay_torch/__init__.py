"""kernelbay-torch: attention backends in plain PyTorch.

- `VANILLA` (`kernelbay_torch.vanilla:VanillaBackend`): the reference; plain math, supports everything.
- `SDPA` (`kernelbay_torch.sdpa:SdpaBackend`): `scaled_dot_product_attention` over the paged cache.
- `FLEX` (`kernelbay_torch.flex:FlexBackend`): compiled `flex_attention` with block masks.

Backends are found through the `kernelbay.attention_backends` entry points; importing this package
imports none of them.
"""
