"""Rendering only: estimates, plans and cost reports as text, Markdown and charts (matplotlib lazily)."""
