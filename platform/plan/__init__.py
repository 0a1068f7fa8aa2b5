"""`trainforge plan`: a stack previewed offline — what the real program registers under the mock engine, the policy
pack's verdicts on it, its monthly cost, and the difference against another stack or revision."""
