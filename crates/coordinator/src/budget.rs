//! What one caller of the proxy may hold of drumsd's memory at once: the
//! bodies of its requests while they are read, and the answers kept for its
//! exchange log while they stream (docs/coordinator.md, docs/security.md).
//!
//! Each connection is bounded on its own (`MAX_REQUEST_BYTES`,
//! `MAX_LOGGED_BYTES`), and drumsd bounds connections per address, but a
//! session may have 64 connections at once: 64 bodies of 32 MiB each would
//! be 2 GiB of drumsd's memory, taken from every other session. So the bytes
//! are also charged to the caller's account here, against one budget per
//! caller, and a request that would go over it is refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Whose account a charge goes to: a session (by id), or, for a request no
/// session is known for, its source address.
pub type Account = String;

/// The accounts, and the budget of each.
#[derive(Clone)]
pub struct Budgets {
    limit: usize,
    held: Arc<Mutex<HashMap<Account, usize>>>,
}

/// Bytes charged to one account, given back when dropped.
pub struct Charge {
    budgets: Budgets,
    account: Account,
    bytes: usize,
}

/// The account's budget would be exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    /// What the account holds already, without this charge.
    pub held: usize,
    pub limit: usize,
}

impl Budgets {
    pub fn new(limit: usize) -> Budgets {
        Budgets {
            limit,
            held: Arc::default(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Account, usize>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty charge to `account`, to grow with [`Charge::grow`].
    pub fn open(&self, account: Account) -> Charge {
        Charge {
            budgets: self.clone(),
            account,
            bytes: 0,
        }
    }

    /// What `account` holds now.
    #[cfg(test)]
    pub fn held_by(&self, account: &str) -> usize {
        self.held().get(account).copied().unwrap_or(0)
    }
}

impl Charge {
    /// Charge `n` more bytes, or refuse (charging nothing) if the account
    /// would then hold more than its budget.
    pub fn grow(&mut self, n: usize) -> Result<(), OverBudget> {
        let limit = self.budgets.limit;
        let mut held = self.budgets.held();
        let now = held.entry(self.account.clone()).or_insert(0);
        if now.saturating_add(n) > limit {
            let over = OverBudget { held: *now, limit };
            if *now == 0 {
                held.remove(&self.account);
            }
            return Err(over);
        }
        *now += n;
        self.bytes += n;
        Ok(())
    }

    /// Charge up to `total` bytes in all (a declared length, once known).
    pub fn grow_to(&mut self, total: usize) -> Result<(), OverBudget> {
        match total.checked_sub(self.bytes) {
            Some(n) if n > 0 => self.grow(n),
            _ => Ok(()),
        }
    }

    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut held = self.budgets.held();
        if let Some(n) = held.get_mut(&self.account) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                held.remove(&self.account);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_holds_at_most_its_budget_and_gets_it_back() {
        let b = Budgets::new(100);
        let mut one = b.open("s".into());
        let mut two = b.open("s".into());
        let mut other = b.open("t".into());
        one.grow(60).unwrap();
        assert_eq!(
            two.grow(41),
            Err(OverBudget {
                held: 60,
                limit: 100
            })
        );
        assert_eq!(two.bytes(), 0, "a refused charge charges nothing");
        two.grow_to(40).unwrap();
        two.grow_to(30).unwrap();
        assert_eq!(b.held_by("s"), 100);
        // Another account has a budget of its own.
        other.grow(100).unwrap();
        drop(one);
        assert_eq!(b.held_by("s"), 40);
        drop(two);
        drop(other);
        assert_eq!(b.held_by("s"), 0);
        assert!(b.held().is_empty(), "no account is left behind");
        // A refusal on an empty account leaves nothing either.
        assert!(b.open("u".into()).grow(101).is_err());
        assert!(b.held().is_empty());
    }
}
