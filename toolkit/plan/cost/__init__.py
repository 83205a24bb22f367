"""The analytic cost model: parameters, FLOPs, memory, compute and communication time of a layout."""
