//! A plan's fixed paths and multicast trees in the one shape both drivers forward by.
//!
//! A scheme's [`Plan`] names its routes by role (GRID pins a worker's gradients to a path and
//! multicasts the server's results down a tree). [`PlanRoutes`] resolves the roles to the
//! hosts that send, groups each tree's edges by parent (in the plan's order, which is the
//! order copies leave in) and states what each switch does with them: the simulator installs
//! every switch's part ([`PlanRoutes::paths`], [`PlanTree::children`]), the runtime switch
//! only its own ([`PlanRoutes::visits_at`], [`PlanRoutes::trees_at`]). Ports are each driver's
//! to name: the simulator reads them off its topology, a runtime switch off its neighbours.
//!
//! What the drivers then do differ in one way only, forced by what a packet carries: a
//! simulated packet carries its path's id and hop count, so the simulator follows the path
//! hop by hop; a real datagram carries neither, so a runtime switch looks its visit up by
//! (source, destination, the node it came from), and [`PlanRoutes::visits_at`] refuses a
//! path that would make that ambiguous.

use crate::{Plan, Role};
use inalab_core::NodeId;
use std::collections::BTreeMap;

/// A path's visit to a switch: (source, destination, the node it comes from) -> the next node.
pub type Visit = ((NodeId, NodeId, NodeId), NodeId);

/// A plan's routes with their senders resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanRoutes {
    /// Fixed paths: the role whose packets take it and its nodes, from that role's host to
    /// its peer's.
    pub paths: Vec<(Role, Vec<NodeId>)>,
    pub trees: Vec<PlanTree>,
}

/// A multicast tree: what its sender's packets to [`inalab_core::GROUP`] are copied along.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanTree {
    pub role: Role,
    /// The host that sends into it.
    pub sender: NodeId,
    /// Each node's children, in the order of the plan's edges.
    pub children: BTreeMap<NodeId, Vec<NodeId>>,
}

impl PlanRoutes {
    /// `plan`'s paths and trees; `host_of` names the host each role runs on. A route of a
    /// role the plan runs no endpoint for is dropped (it has no packets to route).
    pub fn of(plan: &Plan, host_of: impl Fn(Role) -> Option<NodeId>) -> Self {
        let paths = plan.paths.iter().filter(|(role, _)| host_of(*role).is_some()).cloned().collect();
        let trees = plan
            .trees
            .iter()
            .filter_map(|(role, edges)| {
                let sender = host_of(*role)?;
                let mut children: BTreeMap<NodeId, Vec<NodeId>> = BTreeMap::new();
                for &(p, c) in edges {
                    children.entry(p).or_default().push(c);
                }
                Some(PlanTree { role: *role, sender, children })
            })
            .collect();
        PlanRoutes { paths, trees }
    }

    /// Each visit of a fixed path to switch `me`: (source, destination, the node it comes
    /// from) -> the node it goes on to. Refused: a path that enters `me` twice from the same
    /// node and leaves differently (a switch that sees only a datagram could not tell the
    /// visits apart).
    pub fn visits_at(&self, me: NodeId) -> Result<Vec<Visit>, String> {
        let mut visits: BTreeMap<(NodeId, NodeId, NodeId), NodeId> = BTreeMap::new();
        for (role, nodes) in &self.paths {
            let (Some(&src), Some(&dst)) = (nodes.first(), nodes.last()) else { continue };
            for (i, w) in nodes.windows(3).enumerate() {
                if w[1] == me && visits.insert((src, dst, w[0]), w[2]).is_some_and(|old| old != w[2]) {
                    return Err(format!("the fixed path of {role:?} enters switch {me} from node {} twice and leaves it differently (hop {})", w[0], i + 1));
                }
            }
        }
        Ok(visits.into_iter().collect())
    }

    /// The trees through switch `me`: (their sender, `me`'s children in order).
    pub fn trees_at(&self, me: NodeId) -> impl Iterator<Item = (&PlanTree, &[NodeId])> {
        self.trees.iter().filter_map(move |t| t.children.get(&me).map(|c| (t, c.as_slice())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(paths: Vec<(Role, Vec<NodeId>)>, trees: Vec<(Role, Vec<(NodeId, NodeId)>)>) -> Plan {
        Plan { paths, trees, ..Default::default() }
    }
    const W0: Role = Role::Worker { rank: 0 };
    const W1: Role = Role::Worker { rank: 1 };
    const PS: Role = Role::Server { index: 0 };

    #[test]
    fn roles_resolve_to_their_hosts_and_routes_without_an_endpoint_are_dropped() {
        let p = plan(vec![(W0, vec![0, 10, 11, 10, 2]), (W1, vec![1, 10, 2])], vec![(PS, vec![(2, 10), (10, 0), (10, 11), (11, 3)]), (W1, vec![(1, 10)])]);
        let r = PlanRoutes::of(&p, |role| match role {
            Role::Worker { rank: 0 } => Some(0),
            Role::Server { .. } => Some(2),
            _ => None,
        });
        assert_eq!(r.paths, vec![(W0, vec![0, 10, 11, 10, 2])]);
        assert_eq!(r.trees.len(), 1);
        assert_eq!((r.trees[0].role, r.trees[0].sender), (PS, 2));
        // Children in the plan's edge order: the order copies leave in.
        assert_eq!(r.trees_at(10).map(|(t, c)| (t.sender, c.to_vec())).collect::<Vec<_>>(), vec![(2, vec![0, 11])]);
        assert_eq!(r.trees_at(12).count(), 0);
    }

    #[test]
    fn a_switch_visited_twice_keeps_each_visit_by_where_it_comes_from() {
        let r = PlanRoutes::of(&plan(vec![(W0, vec![0, 10, 11, 10, 2])], vec![]), |_| Some(0));
        assert_eq!(r.visits_at(10).unwrap(), vec![((0, 2, 0), 11), ((0, 2, 11), 2)]);
        assert_eq!(r.visits_at(11).unwrap(), vec![((0, 2, 10), 10)]);
        assert!(r.visits_at(12).unwrap().is_empty());
    }

    #[test]
    fn a_path_a_datagram_could_not_follow_is_refused() {
        // Enters 10 from 11 twice, leaving for 12 then for 2.
        let r = PlanRoutes::of(&plan(vec![(W0, vec![0, 11, 10, 12, 11, 10, 2])], vec![]), |_| Some(0));
        let e = r.visits_at(10).unwrap_err();
        assert!(e.contains("enters switch 10 from node 11 twice"), "{e}");
        assert!(r.visits_at(11).is_ok(), "11 is entered from different nodes");
    }
}
