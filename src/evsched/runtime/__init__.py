"""The loops that wire adapters to the core: node (projector + scheduler), worker, replica."""
