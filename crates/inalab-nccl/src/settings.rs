//! What the plugin reads from the environment, each with its default (docs/runtime.md, "PyTorch
//! on GPUs through NCCL").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::Duration;

/// The switch's control address when `INALAB_SWITCH` is not set (as `inalab.torch`'s).
pub const DEFAULT_SWITCH: &str = inalab_net::DEFAULT_CONTROL;
/// The scheme when `INALAB_SCHEME` is not set.
pub const DEFAULT_SCHEME: &str = "switchml";
/// The schemes whose switches take a float tensor from a worker library (`inalab.Client`).
pub const SCHEMES: [&str; 3] = ["switchml", "atp", "dsa"];
/// How long `connect` waits for every head to join by default: 60 s.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// `INALAB_SWITCH`: the switch's control address, host:port.
pub fn switch_setting() -> String {
    std::env::var("INALAB_SWITCH").unwrap_or_else(|_| DEFAULT_SWITCH.into())
}

/// `INALAB_SCHEME`: the job's scheme, one of [`SCHEMES`] (checked at `connect`).
pub fn scheme_setting() -> String {
    std::env::var("INALAB_SCHEME").unwrap_or_else(|_| DEFAULT_SCHEME.into())
}

pub fn switch_addr() -> Result<SocketAddr, String> {
    let s = switch_setting();
    s.to_socket_addrs()
        .map_err(|e| format!("INALAB_SWITCH={s:?}: {e} (host:port of the switch's control plane)"))?
        .next()
        .ok_or_else(|| format!("INALAB_SWITCH={s:?} names no address"))
}

/// `INALAB_NCCL_JOIN_TIMEOUT_S`: how long `connect` waits for every head, seconds.
pub fn join_timeout() -> Result<Duration, String> {
    match std::env::var("INALAB_NCCL_JOIN_TIMEOUT_S") {
        Err(_) => Ok(JOIN_TIMEOUT),
        Ok(s) => match s.parse::<f64>() {
            Ok(t) if t > 0.0 && t.is_finite() => Ok(Duration::from_secs_f64(t)),
            _ => Err(format!("INALAB_NCCL_JOIN_TIMEOUT_S={s:?}: seconds, a number above 0 (default 60)")),
        },
    }
}

/// The address this host's point-to-point listeners bind and advertise: `INALAB_NCCL_ADDR` if
/// set, else the one this host reaches the switch from (so another node can reach it too),
/// else 127.0.0.1.
pub fn advertised_ip() -> Result<IpAddr, String> {
    if let Ok(s) = std::env::var("INALAB_NCCL_ADDR") {
        return s.parse().map_err(|_| format!("INALAB_NCCL_ADDR={s:?}: an IP address of this host (default: the one that routes to INALAB_SWITCH)"));
    }
    let routed = || -> Option<IpAddr> {
        let sw = switch_addr().ok()?;
        let s = UdpSocket::bind(SocketAddr::new(if sw.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() }, 0)).ok()?;
        s.connect(sw).ok()?;
        Some(s.local_addr().ok()?.ip()).filter(|ip| !ip.is_unspecified())
    };
    Ok(routed().unwrap_or(Ipv4Addr::LOCALHOST.into()))
}


#[cfg(test)]
mod tests {
    use super::*;

    // The only test of the library's own binary that touches the environment.
    #[test]
    fn bad_settings_are_refused_naming_the_variable() {
        std::env::set_var("INALAB_NCCL_ADDR", "not-an-address");
        let e = advertised_ip().unwrap_err();
        assert!(e.contains("INALAB_NCCL_ADDR=\"not-an-address\""), "{e}");
        std::env::set_var("INALAB_NCCL_ADDR", "127.0.0.2");
        assert_eq!(advertised_ip(), Ok("127.0.0.2".parse().unwrap()));
        std::env::remove_var("INALAB_NCCL_ADDR");
        std::env::set_var("INALAB_NCCL_JOIN_TIMEOUT_S", "-1");
        assert!(join_timeout().unwrap_err().contains("INALAB_NCCL_JOIN_TIMEOUT_S"));
        std::env::remove_var("INALAB_NCCL_JOIN_TIMEOUT_S");
        assert_eq!(join_timeout(), Ok(JOIN_TIMEOUT));
    }
}
