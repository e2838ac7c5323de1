-- _macros: table macros the queries share, created on every connection by runner.connect (not a query itself).
--
-- mcnemar_cases(pairs): per case, McNemar's 2x2 counts on the trials both sides of a pair ran. `pairs` holds the
-- pair's key columns, then three bit masks over trials: both_mask (the trials both sides have), ca and cb (each
-- side's correct trials). The key columns come back in their order, followed by n_trials, n11, n10, n01, n00; cases
-- with no shared trial are left out.
create macro mcnemar_cases(pairs) as table
select
    * exclude (both_mask, ca, cb),
    bit_count(both_mask)::integer as n_trials,
    bit_count(both_mask & ca & cb)::integer as n11,
    bit_count(both_mask & ca & ~cb)::integer as n10,
    bit_count(both_mask & ~ca & cb)::integer as n01,
    bit_count(both_mask & ~ca & ~cb)::integer as n00
from query_table(pairs)
where both_mask <> 0;

-- mcnemar_sums(per_case): mcnemar_cases' rows (with group_by and "group" added) summed over each group's cases, one
-- row per pair: its key columns (every column but case_id, pa and the counts, in their order), the pair's order
-- (pa, the least over its cases), the counts of cases and trials and the four cells.
create macro mcnemar_sums(per_case) as table
select
    * exclude (case_id, pa, n_trials, n11, n10, n01, n00),
    min(pa) as pa,
    count(*)::integer as n_cases,
    sum(n_trials)::integer as n_trials,
    sum(n11)::integer as n11,
    sum(n10)::integer as n10,
    sum(n01)::integer as n01,
    sum(n00)::integer as n00
from query_table(per_case)
group by all;

-- with_position(cells): the rows of a table of cells (with a setting column) and each setting's position in
-- setting_order (the order the paired tests list their sides in).
create macro with_position(cells) as table
select c.*, o.position from query_table(cells) as c join setting_order as o using (setting);

-- mcnemar_groups(pairs): McNemar's counts of each pair (mcnemar_cases) summed over the cases of each group
-- (mcnemar_sums): every case (group_by and "group" 'all') and each group of case_membership; the pair's sides a and
-- b come after the group columns.
create macro mcnemar_groups(pairs) as table
with
per_case as (
    select * from mcnemar_cases(pairs)
),
grouped as (
    select p.* exclude (a, b), 'all' as group_by, 'all' as "group", p.a, p.b from per_case as p
    union all
    select p.* exclude (a, b), m.group_by, m."group", p.a, p.b from per_case as p join case_membership as m using (case_id, with_image)
)
select * from mcnemar_sums(grouped);
