"""Per-step metadata of the FlashInfer backends: the common fields plus FlashInfer's page table."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from kernelbay.attention import AttentionMetadata

from .page_table import FlashInferPageTable, page_table_from_block_tables

_STEP_IDS = itertools.count()


@dataclass(frozen=True, slots=True)
class FlashInferMetadata(AttentionMetadata):
    # Defaults only because the base class's last fields have them; `build` always sets both.
    page_table: FlashInferPageTable | None = None
    """The step's block tables as FlashInfer's CSR page table, on the host."""
    step_id: int = -1
    """Unique per built metadata: a wrapper planned for another step id is planned again before it runs."""

    def __post_init__(self):
        if self.page_table is None or self.step_id < 0:
            raise ValueError(
                "FlashInferMetadata needs its page table and step id: build it with "
                "FlashInferBackend.prepare(requests, block_size), not from the common fields alone"
            )

    @classmethod
    def _extras(cls, common: AttentionMetadata) -> dict:
        table = page_table_from_block_tables(
            common.query_lens_host, common.seq_lens_host, common.block_tables, common.block_size
        )
        return {"page_table": table, "step_id": next(_STEP_IDS)}
