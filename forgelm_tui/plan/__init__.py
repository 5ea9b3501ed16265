"""Planning: argv and ForgeLM's config to a checked plan, before anything starts."""
