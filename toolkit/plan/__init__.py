"""The pure planning half: descriptions, presets, layouts and rules, the planner (stdlib, pydantic, PyYAML only)."""
