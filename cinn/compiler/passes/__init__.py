"""Graph passes: plain functions Program -> Program, and fusion Program -> groups."""
