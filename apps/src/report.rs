//! Plain-text rendering of engine counters for terminal output.

use std::fmt::Write;

use ustack::node::Snapshot;

/// A measured figure with `decimals` decimals, or `n/a` where there is none
/// (no time span to divide by): never a made-up 0.00.
pub fn figure(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.decimals$}"))
}

/// A compact multi-line report of one stack's counters.
pub fn counters(name: &str, s: &Snapshot) -> String {
    let st = &s.stack;
    let mut out = String::new();
    let _ = writeln!(out, "{name}:");
    let _ = writeln!(
        out,
        "  port   rx {} pkts {} B  tx {} pkts {} B  missed {}  nombuf {}  tx errors {}",
        s.port.rx_packets,
        s.port.rx_bytes,
        s.port.tx_packets,
        s.port.tx_bytes,
        s.port.rx_missed,
        s.port.rx_nombuf,
        s.port.tx_errors
    );
    let o = s.offloads;
    if o.tx_tcp_checksum || o.rx_checksum || o.tso_max > 0 {
        let mut on = Vec::new();
        if o.tx_tcp_checksum {
            on.push("tx tcp checksum".to_string());
        }
        if o.rx_checksum {
            on.push("rx tcp checksum".to_string());
        }
        if o.tso_max > 0 {
            on.push(format!("tso {} B", o.tso_max));
        }
        let _ = writeln!(out, "  offload {}", on.join(", "));
    }
    let _ = writeln!(
        out,
        "  eth    rx {} accepted {} dropped {}  tx {} no-buffer {}",
        st.eth.rx_frames,
        st.eth.rx_accepted,
        st.drops.total(),
        st.eth.tx_frames,
        st.eth.tx_no_buffer
    );
    let _ = writeln!(
        out,
        "  arp    entries {}  hits {} misses {}  req in/out {}/{}  replies in/out {}/{}  pending dropped {}",
        st.arp.entries,
        st.arp.hits,
        st.arp.misses,
        st.arp.rx_requests,
        st.arp.tx_requests,
        st.arp.rx_replies,
        st.arp.tx_replies,
        st.arp.pending_dropped
    );
    let _ = writeln!(
        out,
        "  ipv4   rx {} tx {}  fragments in/out {}/{}  reassembled {}",
        st.ipv4.rx_packets,
        st.ipv4.tx_packets,
        st.ipv4.rx_fragments,
        st.ipv4.tx_fragments,
        st.ipv4.reassembled
    );
    let _ = writeln!(
        out,
        "  icmp   echo req in/out {}/{}  echo rep in/out {}/{}  unreachable in/out {}/{}",
        st.icmp.rx_echo_requests,
        st.icmp.tx_echo_requests,
        st.icmp.rx_echo_replies,
        st.icmp.tx_echo_replies,
        st.icmp.rx_dest_unreachable,
        st.icmp.tx_dest_unreachable
    );
    if st.ipv6.rx_packets + st.ipv6.tx_packets > 0 {
        let _ = writeln!(
            out,
            "  ipv6   rx {} tx {}  echo req in {} rep out {}  neighbor sol in {} adv out/in {}/{}  neighbors {}",
            st.ipv6.rx_packets,
            st.ipv6.tx_packets,
            st.ipv6.rx_echo_requests,
            st.ipv6.tx_echo_replies,
            st.ipv6.rx_neighbor_solicits,
            st.ipv6.tx_neighbor_adverts,
            st.ipv6.rx_neighbor_adverts,
            st.ipv6.neighbors
        );
    }
    let _ = writeln!(
        out,
        "  udp    rx {} dgrams {} B  tx {} dgrams {} B",
        st.udp.rx_datagrams, st.udp.rx_bytes, st.udp.tx_datagrams, st.udp.tx_bytes
    );
    let _ = writeln!(
        out,
        "  tcp    active {} passive {} established {}  resets out/in {}/{}  retransmits {}",
        st.tcp.active_opens,
        st.tcp.passive_opens,
        st.tcp.established,
        st.tcp.resets_sent,
        st.tcp.resets_received,
        st.tcp.retransmits
    );
    if let Some(sh) = &s.shard {
        let _ = writeln!(
            out,
            "  shard  {} of {}  steered out {}  passed on {}  arp copies out {}  mail in {}  mailbox full {}",
            sh.index,
            sh.count,
            sh.stats.steered_out,
            sh.stats.passed_on,
            sh.stats.arp_replicas_out,
            sh.stats.mail_in,
            sh.stats.mailbox_full
        );
    }
    if st.ud.qps > 0 || st.ud.rx_packets > 0 {
        let _ = writeln!(
            out,
            "  ud     qps {}  rx {} pkts {} B  tx {} pkts {} B  tx errors {}",
            st.ud.qps,
            st.ud.rx_packets,
            st.ud.rx_bytes,
            st.ud.tx_packets,
            st.ud.tx_bytes,
            st.ud.tx_errors
        );
    }
    let drops: Vec<String> = st
        .drops
        .nonzero()
        .map(|(n, c)| format!("{n}={c}"))
        .collect();
    if !drops.is_empty() {
        let _ = writeln!(out, "  drops  {}", drops.join(" "));
    }
    for p in &s.pools {
        let _ = writeln!(
            out,
            "  pool   {}: {} of {} in use, {} alloc failures",
            p.name, p.in_use, p.capacity, p.alloc_failures
        );
    }
    out
}

/// Milliseconds with three decimals, as ping prints RTTs.
pub fn ms(d: std::time::Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// iputils ping's closing lines: the header, "N packets transmitted, M
/// received, [+D duplicates, ][+E errors, ]L% packet loss, time Tms", and
/// "rtt min/avg/max/mdev = ..." when there were replies. `what` is `ping`
/// for ICMP (`--- HOST ping statistics ---`).
pub fn ping_statistics(
    dst: &str,
    what: &str,
    counts: [u64; 4],
    rtt: &ustack_kit::ping::RttStats,
    elapsed: std::time::Duration,
) -> String {
    let [transmitted, received, duplicates, errors] = counts;
    let mut out = format!("\n--- {dst} {what} statistics ---\n");
    let _ = write!(
        out,
        "{transmitted} packets transmitted, {received} received"
    );
    if duplicates > 0 {
        let _ = write!(out, ", +{duplicates} duplicates");
    }
    if errors > 0 {
        let _ = write!(out, ", +{errors} errors");
    }
    let loss = if transmitted == 0 {
        0.0
    } else {
        100.0 * transmitted.saturating_sub(received) as f64 / transmitted as f64
    };
    let loss = if loss == loss.trunc() {
        format!("{loss:.0}")
    } else {
        format!("{loss:.4}").trim_end_matches('0').to_string()
    };
    let _ = writeln!(out, ", {loss}% packet loss, time {}ms", elapsed.as_millis());
    if rtt.count > 0 {
        let _ = writeln!(
            out,
            "rtt min/avg/max/mdev = {}/{}/{}/{} ms",
            ms(rtt.min),
            ms(rtt.avg()),
            ms(rtt.max),
            ms(rtt.mdev())
        );
    }
    out
}
