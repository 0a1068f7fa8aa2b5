"""CrossGuard rules for trainforge stacks. The pack itself is built only in policies/__main__.py."""
