"""The fusion planner and its lowering: op classes, legality, profitability, the plan,
attention matching, and one TE compute per fused group."""
