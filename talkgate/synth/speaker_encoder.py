"""The Base checkpoints' speaker encoder: 24 kHz audio -> log-mel -> ECAPA-TDNN -> x-vector [enc_dim].

    enc = SpeakerEncoder(config.speaker_encoder)         # parameters named as `speaker_encoder.*` in the file
    vector = enc.embed(wav_24k)                          # float32 [T] in [-1, 1] -> [enc_dim] (model dtype)

Front end (`log_mel`), as the reference's `mel_spectrogram` with its `extract_speaker_embedding` settings:
the signal is reflect-padded by (n_fft - hop) / 2 = 384 samples a side, STFT with a 1024-sample Hann
window and hop 256 (no centering), magnitude sqrt(re^2 + im^2 + 1e-9), a 128-band Slaney mel filterbank
from 0 to 12 kHz (`mel_filterbank`: librosa.filters.mel's defaults, computed here in float64 and stored in
float32 as librosa does), natural log of max(x, 1e-5). About 93.75 frames a second. The mel is computed in
float32 on the encoder's device; the network runs in the encoder's dtype (the Talker's, as the reference).

Network (ECAPA-TDNN, arXiv 2005.07143; every conv a Conv1d with "same" reflect padding and a bias):
blocks[0] TDNN (conv + ReLU) mel -> C; blocks[1..n-2] SE-Res2Net blocks (1x1 TDNN, Res2Net of `scale`
chunks whose branch i >= 2 adds branch i-1's output, 1x1 TDNN, squeeze-excitation, residual); `mfa` TDNN on
the concatenation of those blocks' outputs; `asp` attentive statistics pooling (global mean and std tiled
over time, TDNN, tanh, 1x1 conv, softmax over time per channel, weighted mean and std); `fc` 1x1 conv to
enc_dim. No normalization of the output: it replaces one codec embedding of the Talker prompt as it is.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from talkgate.synth.config import SpeakerEncoderConfig

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
N_MELS = 128
F_MAX = 12000.0
LOG_FLOOR = 1e-5
STD_EPS = 1e-12


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (200/3 Hz a mel), logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log = f >= 1000.0
    mel = np.where(log, 1000.0 / (200.0 / 3) + np.log(np.where(log, f, 1000.0) / 1000.0) / (np.log(6.4) / 27.0), mel)
    return mel


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f = (200.0 / 3) * m
    min_log_mel = 1000.0 / (200.0 / 3)
    return np.where(m >= min_log_mel, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - min_log_mel)), f)


@functools.lru_cache(maxsize=4)
def mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS, fmin: float = 0.0,
                   fmax: float = F_MAX) -> np.ndarray:
    """[n_mels, n_fft // 2 + 1] float32 Slaney-normalized triangular filters (librosa.filters.mel's defaults)."""
    fft_freqs = np.fft.rfftfreq(n_fft, 1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fft_freqs)
    weights = np.zeros((n_mels, n_fft // 2 + 1), dtype=np.float32)
    for i in range(n_mels):
        weights[i] = np.maximum(0, np.minimum(-ramps[i] / fdiff[i], ramps[i + 2] / fdiff[i + 1]))
    weights *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]    # float32 *= float64, as librosa
    return weights


def log_mel(wav: torch.Tensor) -> torch.Tensor:
    """wav [B, T] float32 at 24 kHz -> log-mel [B, frames, 128] float32 (frames = (T - 256) // 256 + 1 after
    the 384-sample reflect padding a side)."""
    basis = torch.from_numpy(mel_filterbank()).to(wav.device)
    window = torch.hann_window(N_FFT, device=wav.device)
    pad = (N_FFT - HOP) // 2
    x = F.pad(wav[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(x, N_FFT, hop_length=HOP, win_length=N_FFT, window=window, center=False, normalized=False,
                      onesided=True, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ magnitude, min=LOG_FLOOR)).transpose(1, 2)


def _conv(c_in: int, c_out: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    """Conv1d ("same", reflect) + ReLU."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1):
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(channels // scale, channels // scale, kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        for i in range(1, self.scale):
            out.append(self.blocks[i - 1](parts[i] if i == 1 else parts[i] + out[-1]))
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = _conv(channels, se_channels, 1)
        self.conv2 = _conv(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * s


class SERes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(c_in, c_out, 1)
        self.res2net_block = Res2Net(c_out, scale, kernel, dilation)
        self.tdnn2 = TDNN(c_out, c_out, 1)
        self.se_block = SqueezeExcitation(c_out, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _statistics(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and std over time: x [B, C, T], weights [B, 1 or C, T] summing to 1 over T."""
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean[..., None]).pow(2)).sum(2).clamp(STD_EPS))
    return mean, std


class AttentiveStatisticsPooling(nn.Module):
    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(3 * channels, attention_channels, 1)
        self.conv = _conv(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C, T] -> [B, 2C, 1]: attention-weighted mean and std."""
        T = x.shape[-1]
        ones = x.new_ones(x.shape[0], 1, T)
        uniform = ones / ones.sum(2, keepdim=True)        # T counted in x's dtype, as the reference does
        mean, std = _statistics(x, uniform)
        context = torch.cat([x, mean[..., None].expand(-1, -1, T), std[..., None].expand(-1, -1, T)], dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _statistics(x, attention)
        return torch.cat([mean, std], dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.cfg = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        self.blocks = nn.ModuleList(
            [TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])]
            + [SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
               for i in range(1, len(ch) - 1)])
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatisticsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(2 * ch[-1], cfg.enc_dim, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, frames, mel_dim] -> [B, enc_dim]."""
        x = mel.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[..., 0]

    @torch.inference_mode()
    def embed(self, wav: torch.Tensor | np.ndarray) -> torch.Tensor:
        """One clip: float32 [T] at 24 kHz -> x-vector [enc_dim] in the encoder's dtype, on its device."""
        w = self.fc.weight
        wav = torch.as_tensor(wav).to(device=w.device, dtype=torch.float32)
        mel = log_mel(wav[None])
        return self(mel.to(w.dtype))[0]
